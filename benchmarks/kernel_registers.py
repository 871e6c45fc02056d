"""Registers and spills of the batch-1 decode kernels at Qwen3-8B shapes (and Qwen3-32B's
two-tile gate_up), compiled for an H200 (sm_90) on any Linux machine, GPU or not (Triton's wheel
carries ptxas). The launches are captured from the real host functions, with the H200's 132 SMs
so that they pick the H200's splits and tiles, and compiled as the GPU launch would specialise
them, PDL on as on Hopper.

    python benchmarks/kernel_registers.py     # one JSON object: kernel -> [registers, spilled bytes]

Registers decide how many programs fit on an SM: at 4 warps, 128 registers a thread allow 4.
"""

import json
import os
import sys

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("run without TRITON_INTERPRET=1: the kernels must be compiled, not interpreted")

import torch  # noqa: E402

from hotpath.ops.attention import triton_decode  # noqa: E402
from hotpath.ops.linear import triton_gemv  # noqa: E402
from hotpath.ops.triton_utils import compiled_resources  # noqa: E402
from launch_capture import capture  # noqa: E402  (benchmarks/ is on the path when run as a script)

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, INTERMEDIATE = 32, 8, 128, 4096, 12288
BF16 = dict(dtype=torch.bfloat16)


def resources(module, kernel_name: str, launch, others: tuple[str, ...] = ()) -> tuple[int, int]:
    """The kernel's [registers, spilled bytes] as `launch` calls it on an H200 (132 SMs), PDL on;
    `others`: kernels the same launch also calls, recorded and dropped."""
    recorded = capture(module, kernel_name, launch, others, sms=132, use_pdl=True)
    return compiled_resources(recorded.fn, recorded.args, recorded.kwargs)


def decode_attention(batch: int, kernel: str = "_decode_split_kernel") -> tuple[int, int]:
    """A decode step at a 700-token context in a graph sized for 784 (the bench's batch-1 shape)."""
    blocks_per_seq = 49
    qkv = torch.empty(batch, (HEADS + 2 * KV_HEADS) * HEAD_DIM, **BF16)  # the qkv projection's rows
    q = qkv[:, : HEADS * HEAD_DIM].view(batch, HEADS, HEAD_DIM)
    k = qkv[:, HEADS * HEAD_DIM : (HEADS + KV_HEADS) * HEAD_DIM].view(batch, KV_HEADS, HEAD_DIM)
    v = qkv[:, (HEADS + KV_HEADS) * HEAD_DIM :].view(batch, KV_HEADS, HEAD_DIM)
    k_cache = torch.empty(batch * blocks_per_seq, 16, KV_HEADS, HEAD_DIM, **BF16)
    v_cache = torch.empty_like(k_cache)
    cu_query_lens = torch.arange(batch + 1, dtype=torch.int32)
    context_lens = torch.full((batch,), 700, dtype=torch.int32)
    block_tables = torch.arange(batch * blocks_per_seq, dtype=torch.int32).view(batch, blocks_per_seq)
    rope = (k, v, torch.empty(1024, HEAD_DIM), torch.empty(HEAD_DIM, **BF16), torch.empty(HEAD_DIM, **BF16), 1e-6)
    # batch 1 merges its splits in a kernel of its own
    others = ("_merge_head_kernel", "_decode_split_kernel")
    return resources(triton_decode, kernel, lambda: triton_decode.paged_attention(
        q, k_cache, v_cache, cu_query_lens, context_lens, block_tables, HEAD_DIM**-0.5, 1, 784,
        rope=rope), tuple(o for o in others if o != kernel))


def projections() -> dict[str, tuple[int, int]]:
    """A layer's batch-1 projections in their fused forms (DecoderLayer.forward_few_rows)."""
    h = torch.empty(1, HIDDEN, **BF16)
    rms = (torch.empty(512, 1), torch.empty(HIDDEN, **BF16), 1e-6)
    launches = {
        "qkv": lambda: triton_gemv.linear(h, torch.empty(6144, HIDDEN, **BF16), rms=rms),
        "gate_up": lambda: triton_gemv.linear_silu_and_mul(h, torch.empty(2 * INTERMEDIATE, HIDDEN, **BF16), rms=rms),
        "o_proj": lambda: triton_gemv.linear_add_residual(
            torch.empty(1, HIDDEN, **BF16), torch.empty(HIDDEN, HIDDEN, **BF16), h),
        "down": lambda: triton_gemv.linear_add_residual(
            torch.empty(1, INTERMEDIATE, **BF16), torch.empty(HIDDEN, INTERMEDIATE, **BF16), h),
    }
    # Qwen3-32B's gate_up: K = 5120 in two tiles, 4096 + 1024, both held before PDL's wait
    h32 = torch.empty(1, 5120, **BF16)
    launches["qwen3-32b gate_up (two tiles)"] = lambda: triton_gemv.linear_silu_and_mul(
        h32, torch.empty(51200, 5120, **BF16), rms=(torch.empty(640, 1), torch.empty(5120, **BF16), 1e-6))
    return {name: resources(triton_gemv, "_gemv_kernel", launch) for name, launch in launches.items()}


def main() -> None:
    table = {"attention, batch 1 (splits)": decode_attention(1),
             "attention, batch 1: the merge kernel": decode_attention(1, "_merge_head_kernel"),
             "attention, batch 64 (no splits)": decode_attention(64)}
    table.update({f"gemv {name}": r for name, r in projections().items()})
    print(json.dumps(table))


if __name__ == "__main__":
    main()
