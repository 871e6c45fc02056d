"""64 concurrent streaming requests through the server give the offline API's greedy outputs."""

import asyncio

import openai

from server_utils import API_KEY
from hotpath import LLM, SamplingParams

NUM_REQUESTS = 64
MAX_TOKENS = 16


def test_64_concurrent_streams_match_offline(server, tiny_chat_model):
    prompts = [f"Request {i}: the quick brown fox number {i * 7}" for i in range(NUM_REQUESTS)]

    async def one(client, prompt):
        text, finish = "", None
        stream = await client.completions.create(model="tiny", prompt=prompt, temperature=0,
                                                 max_tokens=MAX_TOKENS, stream=True,
                                                 extra_body={"ignore_eos": True})
        async for chunk in stream:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        return text, finish

    async def run_all():
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0,
                                    timeout=300)
        async with client:
            return await asyncio.gather(*(one(client, p) for p in prompts))

    results = asyncio.run(run_all())
    llm = LLM(str(tiny_chat_model), device="cpu", dtype="float32")
    offline = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),
                           use_tqdm=False)
    assert [finish for _, finish in results] == ["length"] * NUM_REQUESTS
    assert [text for text, _ in results] == [o.outputs[0].text for o in offline]
