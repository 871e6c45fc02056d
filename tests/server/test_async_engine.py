"""The async front in-process: concurrent streams, abort on close, errors, shutdown."""

import asyncio

import pytest

from hotpath.args import EngineArgs
from hotpath.engine.async_engine import AsyncEngine
from hotpath.engine.engine import Engine
from hotpath.engine.front import EngineDeadError
from hotpath.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tiny_chat_model):
    return Engine(EngineArgs(model=str(tiny_chat_model), device="cpu", dtype="float32"))


async def run(engine, body):
    front = AsyncEngine(engine)
    front.start()
    try:
        return await body(front)
    finally:
        front.shutdown()


def test_concurrent_streams_are_cumulative_and_match_serial(engine):
    prompts = [f"prompt number {i}" for i in range(8)]

    async def body(front):
        async def one(i, p):
            texts = []
            async for out in front.generate(f"r{i}", p, GREEDY):
                texts.append(out.outputs[0].text)
            assert out.finished and len(out.outputs[0].token_ids) == 12
            assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # cumulative
            return texts[-1]

        together = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        serial = [await one(100 + i, p) for i, p in enumerate(prompts)]
        return together, serial

    together, serial = asyncio.run(run(engine, body))
    assert together == serial
    assert engine.kv_cache.usage == 0.0 and not engine.has_unfinished_requests()


def test_closing_a_stream_aborts_and_frees_blocks(engine):
    async def body(front):
        stream = await front.add_request("long", "Hello", SamplingParams(temperature=0, max_tokens=400,
                                                                          ignore_eos=True))
        await stream.__anext__()
        assert engine.kv_cache.usage > 0
        stream.close()
        for _ in range(200):
            s = front.stats
            if s.num_aborted == 1 and s.num_running == 0 and s.kv_cache_usage == 0.0:
                break
            await asyncio.sleep(0.01)
        return front.stats

    stats = asyncio.run(run(engine, body))
    assert stats.num_running == 0 and stats.kv_cache_usage == 0.0 and stats.num_aborted == 1
    assert not engine.has_unfinished_requests()


def test_rejected_request_raises_and_queues_nothing(engine):
    async def body(front):
        with pytest.raises(ValueError, match="max_model_len"):
            await front.add_request("too-long", {"prompt_token_ids": [5] * 600}, GREEDY)
        # the loop still serves
        outs = [o async for o in front.generate("ok", "Hello", GREEDY)]
        return outs[-1]

    assert asyncio.run(run(engine, body)).finished


def test_no_requests_after_shutdown(engine):
    async def body():
        front = AsyncEngine(engine)
        front.start()
        front.shutdown()
        with pytest.raises(EngineDeadError):
            await front.add_request("late", "Hello", GREEDY)

    asyncio.run(body())
