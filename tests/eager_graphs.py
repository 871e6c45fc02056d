"""A CUDA graph stand-in for the CPU: capture runs the forward once, replay reruns it eagerly and
writes into the captured outputs, so a runner's graph paths (static inputs, padding rows,
sampling inside the graph) run on the CPU as on a GPU, but for the graph itself."""


class EagerReplay:
    def __init__(self, forward):
        self.forward = forward
        self.logits = forward()

    def replay(self) -> None:
        self.logits.copy_(self.forward())


def eager_capture(forward):
    graph = EagerReplay(forward)
    return graph, graph.logits


def capture_eager_graphs(llm) -> None:
    """Captures an in-process engine's decode (and speculative) graphs with the stand-in, and
    tells the engine which batch sizes its runner now replays."""
    executor = llm.engine.executor
    executor.runner._capture_decode_graphs(capture=eager_capture)
    executor.info = executor.worker.info()
