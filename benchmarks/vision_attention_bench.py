"""The vision tower's attention at Qwen3-VL's shape (16 heads of 72, bf16), one 1280x1280 image
(6,400 patches) and eight: hotpath's Triton varlen kernel beside torch's scaled_dot_product_attention
on its cuDNN and flash backends (one call per image), in microseconds and TFLOP/s.

    python benchmarks/vision_attention_bench.py --json out.json
"""

from __future__ import annotations

import argparse
import functools
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from hotpath.bench.roofline import _time_cuda as timed
from hotpath.ops.vision_attention import triton as kernels


def sdpa(q, k, v, bounds, scale, backend):
    def run():
        with sdpa_kernel(backend):
            return [F.scaled_dot_product_attention(q[a:b].transpose(0, 1), k[a:b].transpose(0, 1),
                                                   v[a:b].transpose(0, 1), scale=scale)
                    for a, b in bounds]
    return run


def main(ns: argparse.Namespace) -> list[dict]:
    heads, dim, scale = 16, 72, 72**-0.5
    results = []
    for images in (1, 8):
        tokens = 6400
        q, k, v = (torch.randn(images * tokens, heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        cu = torch.arange(0, images + 1, device="cuda", dtype=torch.int32) * tokens
        bounds = [(i * tokens, (i + 1) * tokens) for i in range(images)]
        flops = images * 4 * tokens * tokens * heads * dim
        row = {"images": images, "tokens_per_image": tokens, "heads": heads, "head_dim": dim}
        row["triton_s"] = timed(functools.partial(kernels.varlen_attention, q, k, v, cu, tokens, scale))
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            try:
                row[f"sdpa_{name}_s"] = timed(sdpa(q, k, v, bounds, scale, backend))
            except RuntimeError as e:
                row[f"sdpa_{name}_error"] = str(e).splitlines()[0][:200]
        for key in [name for name in row if name.endswith("_s")]:
            row[key.removesuffix("_s") + "_tflops"] = flops / row[key] / 1e12
        results.append(row)
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    ns = p.parse_args()
    out = main(ns)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(out, f, indent=2)
