"""The executor for one rank in the engine's own process: plans handed over as objects."""

from __future__ import annotations

from hotpath.executor.worker import Worker, WorkerInfo
from hotpath.resolve import Resolved
from hotpath.runner.model_runner import ModelRunner
from hotpath.runner.plan import SampledToken, StepPlan
from hotpath.structured.bitmask import TokenMask


class InProcessExecutor:
    def __init__(self, resolved: Resolved) -> None:
        self.worker = Worker(resolved)
        self.info: WorkerInfo = self.worker.info()

    @property
    def runner(self) -> ModelRunner:
        """The runner itself (tests and benchmarks that look inside it; one rank only)."""
        return self.worker.runner

    def launch(self, plan: StepPlan) -> int:
        return self.worker.launch(plan)

    def sample(self, step_id: int, mask: TokenMask) -> None:
        self.worker.sample(step_id, mask)

    def collect(self, step_id: int, gone: list[int]) -> dict[int, list[SampledToken]]:
        return self.worker.collect(step_id, gone)

    def propose(self, plan: StepPlan) -> dict[int, tuple[list[int], int]]:
        return self.worker.propose(plan)

    def shutdown(self) -> None:
        pass
