"""The engine's only door to the model: executors that run step plans on one or more workers."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hotpath.resolve import Resolved


def make_executor(resolved: Resolved):
    """The runner in this process (backend "uni"), or a worker process per rank ("mp")."""
    if resolved.executor_backend == "uni":
        from hotpath.executor.inprocess import InProcessExecutor

        return InProcessExecutor(resolved)
    from hotpath.executor.multiproc import MultiprocExecutor

    return MultiprocExecutor(resolved)
