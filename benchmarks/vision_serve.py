"""Concurrent image chats against a running `hotpath serve` (the official openai client, streamed):
throughput and TTFT / inter-token latency percentiles. Every request carries its own random image
(a PNG data URL), so the encoder cache serves none.

    python benchmarks/vision_serve.py --base-url http://127.0.0.1:8000/v1 --model NAME \
        --num-requests 16 --image-size 1280x1280 --max-tokens 128 --output-json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import statistics
import time

import numpy as np
from openai import AsyncOpenAI
from PIL import Image


def data_url(rng: np.random.Generator, width: int, height: int) -> str:
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


async def one_chat(client: AsyncOpenAI, model: str, url: str, max_tokens: int) -> dict:
    start = time.perf_counter()
    stamps = []
    stream = await client.chat.completions.create(
        model=model, max_tokens=max_tokens, temperature=0, stream=True,
        extra_body={"ignore_eos": True, "min_tokens": max_tokens},
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                               {"type": "text", "text": "Describe this image in detail."}]}])
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.perf_counter())
    return {"ttft_s": stamps[0] - start, "itl_s": [b - a for a, b in zip(stamps, stamps[1:])],
            "chunks": len(stamps), "latency_s": stamps[-1] - start}


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def main(ns: argparse.Namespace) -> None:
    width, height = (int(x) for x in ns.image_size.split("x"))
    rng = np.random.default_rng(0)
    client = AsyncOpenAI(base_url=ns.base_url, api_key="none", timeout=600)
    await one_chat(client, ns.model, data_url(rng, width, height), 8)  # warm-up
    urls = [data_url(rng, width, height) for _ in range(ns.num_requests)]
    start = time.perf_counter()
    results = await asyncio.gather(*(one_chat(client, ns.model, u, ns.max_tokens) for u in urls))
    wall = time.perf_counter() - start
    ttft = [r["ttft_s"] for r in results]
    itl = [x for r in results for x in r["itl_s"]]
    out = {"num_requests": ns.num_requests, "image_size": ns.image_size, "max_tokens": ns.max_tokens,
           "wall_s": wall, "output_tokens_per_s": sum(r["chunks"] for r in results) / wall,
           "ttft_p50_s": statistics.median(ttft), "ttft_p99_s": percentile(ttft, 0.99),
           "itl_p50_s": statistics.median(itl), "itl_p99_s": percentile(itl, 0.99),
           "date": time.strftime("%Y-%m-%d")}
    print(json.dumps(out, indent=2))
    if ns.output_json:
        with open(ns.output_json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--num-requests", type=int, default=16, help="chats sent at once")
    p.add_argument("--image-size", default="1280x1280", help="WIDTHxHEIGHT of each random image")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--output-json", default=None)
    asyncio.run(main(p.parse_args()))
