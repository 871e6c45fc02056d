"""The server's end of the engine pipe reads every message waiting when it wakes, so a stream read
once after several engine steps gets all their tokens in one output (one chunk to its client)."""

import asyncio
import multiprocessing

from hotpath.engine.engine_client import EngineClient
from hotpath.engine.engine_process import STEP
from hotpath.engine.front import EngineStats, ModelInfo, RequestStream

INFO = ModelInfo(model_dir="m", device="cpu", dtype="float32", max_model_len=64, vocab_size=100,
                 block_size=16, num_kv_blocks=8)


def delta(step: int, finished: bool = False) -> tuple:
    """Request r's delta of one step: token 10 + step, text "t<step>"; the prompt with the first."""
    prompt = ("p", [1, 2]) if step == 0 else None
    seq = (0, f"t{step}", [10 + step], None, None, "length" if finished else None, None)
    return ("r", prompt, [seq], finished, 0, {})


def test_one_wake_reads_every_waiting_step_and_the_stream_sees_them_as_one_output():
    ours, theirs = multiprocessing.Pipe()
    client = EngineClient(None, ours, INFO, None)
    loop = asyncio.new_event_loop()
    try:
        async def run():
            stream = RequestStream("r", client)
            client._streams["r"] = stream
            for step in range(3):
                theirs.send((STEP, [], [], [delta(step)], EngineStats(num_steps=step + 1)))
            client._on_readable()  # one wake-up
            assert client.stats.num_steps == 3 and not ours.poll()
            out = await stream.__anext__()
            assert out.outputs[0].text == "t0t1t2" and out.outputs[0].token_ids == [10, 11, 12]
            theirs.send((STEP, [], [], [delta(3, finished=True)], EngineStats(num_steps=4)))
            client._on_readable()
            last = await stream.__anext__()
            assert last.finished and last.outputs[0].token_ids == [10, 11, 12, 13]
            assert out.outputs[0].token_ids == [10, 11, 12]  # the earlier output is not extended
            assert "r" not in client._streams

        loop.run_until_complete(run())
    finally:
        loop.close()
        ours.close()
        theirs.close()
