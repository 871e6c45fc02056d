"""Attention's output projection for a one-token decode, merging the context splits as it loads
its input: the merge of flash-decoding moved out of the attention kernel.

In the attention kernel (triton_decode) the last split of a kv head to finish merges the splits:
a fence, an atomic counter and a dependent read of every split's partials, all after the
split's own work and all on the step's critical path (run F measured the merge at ~2.4 us a
layer at Qwen3-0.6B and ~4.3 at Qwen3-8B on an H200). Here nothing waits: with
paged_attention(defer=...) each split stores its partials and leaves, and the projection,
split along K by kv head, merges the one kv head it needs:

- a program owns BLOCK_N output features and the columns of one kv head's q heads
  (GROUP x head_dim). Its weight tile is loaded before PDL's wait, as the GEMV's is;
- after the wait it reads that kv head's partials (one round for up to BLOCK_S splits), merges
  them with the log-sum-exp weights, rounds the merged output to the model dtype (the value the
  reference's attention output holds) and sums the tile against it;
- the kv heads' shares of each output are added into an fp32 buffer, which the attention kernel
  zeroed, with atomics nobody waits for. The sum is rounded by its consumer (the gate_up GEMV's
  `pending` prologue, which also adds it into the residual stream), so the result is that of the
  reference's projection up to the order of the fp32 additions (which varies from run to run).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotpath.ops.attention.triton_common import next_power_of_2
from hotpath.ops.attention.triton_decode import SplitPartials
from hotpath.ops.triton_utils import (
    pdl_enabled,
    pdl_launch_dependents,
    pdl_wait,
    sm_count,
    tl_dtype,
)

# fp32 partials a round reads: 8 splits at 4 q heads per kv head and head_dim 128, 127 registers
# a thread at Qwen3-8B shapes (Triton 3.6), two programs an SM; 8192 took 151, one
MERGE_ELEMENTS = 4096
# bytes of weight a program holds, over 4 warps: at Qwen3-0.6B 64 rows x one kv head's 256
# columns, 128 programs. H200, run I, step us (call 4 / call 6): 64 rows over 8 warps 665.5 /
# -, 32 rows over 4 648.7 / 650.5, 64 over 4 - / 640.9; 16 or 8 rows, 2 or 8 warps 647-770
TILE_BYTES = 32768
# the weight the new form takes: what the GEMV's 8 x 4096 tiles, one an SM, hold in one wave
ONE_WAVE_BYTES_PER_SM = 65536


@triton.jit
def _merge_project_kernel(
    part_out_ptr,  # [1, num_heads, num_splits, HEAD_DIM] fp32
    part_lse_ptr,  # [1, num_heads, num_splits] fp32, log2 units
    context_lens_ptr,  # [1] int32
    w_ptr,  # [N, num_heads * HEAD_DIM]
    out_ptr,  # [1, N] fp32, zero before the call; the projection is added into it
    N,
    num_splits,
    stride_wn,
    GROUP: tl.constexpr,  # q heads per kv head
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    GROUP_PAD: tl.constexpr,  # next_power_of_2(GROUP)
    KW: tl.constexpr,  # GROUP_PAD * HEAD_DIM_PAD: a program's columns, padded
    TILE_N: tl.constexpr,  # keys per attention tile: a split holds whole tiles
    BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr,  # splits merged a round
    ROUND_DTYPE: tl.constexpr,  # the attention output's dtype
    USE_PDL: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    pid_n = tl.program_id(0)
    kv_head = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tl.arange(0, KW)  # column j = (q head of the group) * HEAD_DIM_PAD + dimension
    head = kv_head * GROUP + j // HEAD_DIM_PAD
    d = j % HEAD_DIM_PAD
    j_ok = (j // HEAD_DIM_PAD < GROUP) & (d < HEAD_DIM)
    # rows past N read row N - 1 (never stored), so the loads need no row mask
    w_rows = w_ptr + tl.minimum(rn, N - 1).to(tl.int64)[:, None] * stride_wn
    w = tl.load(w_rows + (head * HEAD_DIM + d)[None, :], mask=j_ok[None, :], other=0.0)
    ctx = tl.load(context_lens_ptr)
    split_len = tl.cdiv(tl.cdiv(ctx, num_splits), TILE_N) * TILE_N
    used = tl.cdiv(ctx, split_len)  # the splits that hold context (the others store nothing)
    pdl_wait(USE_PDL)

    # the merge's weights per (split, q head) [BLOCK_S, GROUP_PAD], spread over the head's
    # columns [BLOCK_S, KW] only to multiply the partials (loading the log-sum-exps column-wise
    # took 255 registers and spilled at Qwen3-8B shapes)
    g = tl.arange(0, GROUP_PAD)
    g_head = kv_head * GROUP + g
    run_max = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    weight_sum = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([KW], tl.float32)
    for s0 in range(0, used, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        s_ok = (s < used)[:, None]
        lse = tl.load(part_lse_ptr + g_head[None, :] * num_splits + s[:, None],
                      mask=s_ok & (g < GROUP)[None, :], other=float("-inf"))
        part = tl.load(part_out_ptr + (head[None, :] * num_splits + s[:, None]) * HEAD_DIM + d[None, :],
                       mask=s_ok & j_ok[None, :], other=0.0)  # [BLOCK_S, KW]
        new_max = tl.maximum(run_max, tl.max(lse, 0))
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)  # padding heads
        weight = tl.exp2(lse - shift[None, :])  # [BLOCK_S, GROUP_PAD]
        rescale = tl.exp2(run_max - shift)
        spread = tl.reshape(tl.broadcast_to(weight[:, :, None], (BLOCK_S, GROUP_PAD, HEAD_DIM_PAD)),
                            (BLOCK_S, KW))
        head_rescale = tl.reshape(tl.broadcast_to(rescale[:, None], (GROUP_PAD, HEAD_DIM_PAD)), (KW,))
        acc = acc * head_rescale + tl.sum(part * spread, 0)
        weight_sum = weight_sum * rescale + tl.sum(weight, 0)
        run_max = new_max
    # every head has seen its own token's key in some split; padding heads sum to 0
    total = tl.reshape(tl.broadcast_to(tl.where(g < GROUP, weight_sum, 1.0)[:, None],
                                       (GROUP_PAD, HEAD_DIM_PAD)), (KW,))
    x = (acc / total).to(ROUND_DTYPE).to(tl.float32)
    y = tl.sum(w.to(tl.float32) * x[None, :], 1)  # [BLOCK_N]
    tl.atomic_add(out_ptr + rn, y, mask=rn < N, sem="relaxed")


def _block_n(num_heads: int, num_kv_heads: int, head_dim: int, elem_size: int) -> tuple[int, int]:
    """(rows a program, its padded columns): tiles of TILE_BYTES, at least 8 rows."""
    kw = next_power_of_2(num_heads // num_kv_heads) * max(16, next_power_of_2(head_dim))
    return next_power_of_2(max(8, TILE_BYTES // (kw * elem_size))), kw


def pays(N: int, num_heads: int, num_kv_heads: int, head_dim: int, elem_size: int,
         device: torch.device) -> bool:
    """True where moving the merge here was measured faster: a projection small enough to
    stream in one wave (Qwen3-0.6B's 4 MB: the step 2.4-3.6% faster on an H200). Every program
    merges its kv head's splits after its wait, and that chain costs more than the merge in
    attention did (~3 us a layer at 0.6B, ~6.5 at 8B, run I call 4), so it pays only while all
    the programs run at once; Qwen3-8B's 33.5 MB o_proj streams in waves, each repeating the
    merge (the step 3.4% slower; docs/benchmarks.md run I)."""
    return N * num_heads * head_dim * elem_size <= ONE_WAVE_BYTES_PER_SM * sm_count(device)


def merge_and_project(
    partials: SplitPartials,
    weight: torch.Tensor,  # [N, num_heads * head_dim], the output projection, K contiguous
    out: torch.Tensor,  # [1, N] fp32, zeroed by the attention call that made `partials`
    num_kv_heads: int,
    *,
    block_n: int | None = None,  # tuning: force the rows a program, and its warps
    num_warps: int | None = None,
) -> torch.Tensor:  # out, holding the projection's fp32 sums (not rounded)
    """out += merge(partials) @ weight^T, the merge rounded to the weight's dtype first (as the
    attention output is), in one launch after the deferred attention."""
    _, num_heads, num_splits, head_dim = partials.out.shape
    N, K = weight.shape
    assert K == num_heads * head_dim and weight.stride(1) == 1 and num_heads % num_kv_heads == 0
    assert out.shape == (1, N) and out.dtype == torch.float32 and out.is_contiguous()
    group = num_heads // num_kv_heads
    head_dim_pad = max(16, next_power_of_2(head_dim))
    rule_block_n, kw = _block_n(num_heads, num_kv_heads, head_dim, weight.element_size())
    block_n = block_n or rule_block_n
    num_warps = num_warps or 4
    use_pdl = pdl_enabled(weight.device)
    _merge_project_kernel[(triton.cdiv(N, block_n), num_kv_heads)](
        partials.out, partials.lse, partials.context_lens, weight, out,
        N, num_splits, weight.stride(0),
        GROUP=group, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, GROUP_PAD=next_power_of_2(group), KW=kw,
        TILE_N=partials.block_n, BLOCK_N=block_n,
        BLOCK_S=min(next_power_of_2(num_splits), max(1, MERGE_ELEMENTS // kw)),
        ROUND_DTYPE=tl_dtype(weight.dtype), USE_PDL=use_pdl,
        num_warps=num_warps, num_stages=1, launch_pdl=use_pdl,
    )
    return out
