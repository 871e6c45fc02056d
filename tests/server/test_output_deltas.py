"""Outputs cross the engine process's pipe as deltas and are rebuilt into the same cumulative
RequestOutputs the Engine made."""

import pickle

from hotpath.engine.output_deltas import DeltaEncoder, OutputAssembler
from hotpath.outputs import CompletionOutput, Logprob, RequestOutput


def output(text0: str, tokens0: list[int], text1: str, tokens1: list[int], finished: bool) -> RequestOutput:
    """Request r, n=2, the first choice with logprobs as the engine gives them (cumulative)."""
    logprobs = [{t: Logprob(-0.5, 1, str(t))} for t in tokens0]
    return RequestOutput(
        "r", "the prompt", [7, 8, 9],
        [CompletionOutput(0, text0, tokens0, -0.5 * len(tokens0), logprobs, "length" if finished else None),
         CompletionOutput(1, text1, tokens1, None, None, "stop" if finished else None, "!" if finished else None)],
        finished, num_cached_tokens=2, metrics={"arrival_time": 1.0},
    )


def test_deltas_rebuild_the_cumulative_outputs():
    steps = [output("a", [1], "", [], False),
             output("ab", [1, 2], "x", [5], False),
             output("ab", [1, 2], "x", [5], False),  # held back text: nothing new
             output("abcd", [1, 2, 3], "xy", [5, 6], True)]
    encoder, assembler = DeltaEncoder(), OutputAssembler()
    for i, out in enumerate(steps):
        delta = pickle.loads(pickle.dumps(encoder.encode(out)))  # as it travels
        assert (delta[1] is not None) == (i == 0)  # the prompt goes once
        assert assembler.apply(delta).output() == out
    assert not encoder._sent and not assembler._requests  # finished requests are forgotten


def test_an_aborted_request_is_forgotten_on_both_sides():
    encoder, assembler = DeltaEncoder(), OutputAssembler()
    assembler.apply(encoder.encode(output("a", [1], "", [], False)))
    encoder.forget("r")
    assembler.forget("r")
    again = output("b", [4], "", [], False)  # a new request that reuses the id starts afresh
    assert assembler.apply(encoder.encode(again)).output() == again


def test_an_output_read_after_several_deltas_is_the_newest_and_earlier_reads_stay_as_they_were():
    """A server behind its engine reads a stream once for several steps' deltas."""
    steps = [output("a", [1], "", [], False),
             output("ab", [1, 2], "x", [5], False),
             output("abcd", [1, 2, 3], "xy", [5, 6], True)]
    encoder, assembler = DeltaEncoder(), OutputAssembler()
    state = assembler.apply(encoder.encode(steps[0]))
    first = state.output()
    for out in steps[1:]:
        assert assembler.apply(encoder.encode(out)) is state
    assert state.output() == steps[-1]
    assert first == steps[0]  # its lists are copies, not the ones later deltas extended
