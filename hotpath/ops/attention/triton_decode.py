"""Decode attention over the paged KV cache: flash-decoding, for steps whose queries are few per
sequence (a decode's one token, or the k+1 tokens of a speculative verify step).

One program handles (sequence, kv head, split of the context). Its query rows are every query token
of the sequence times every q head sharing that kv head (GQA), so each K/V tile is read from memory
once for the whole group and the dot products have enough rows for tensor cores. Splitting the
context lets batch-1 long-context decode use every SM. With a single split the program writes the
output directly.

With several splits the whole op is still one launch: at batch 1 a decode step is a chain of short
kernels in a CUDA graph, ~2 us of launch each, so a second launch to merge the splits would cost
about as much as the merge itself, in every layer. Each split stores its normalised partial output
and log-sum-exp; the last split of a (sequence, kv head) to finish (a counter per pair, bumped
atomically, says which) merges every split's partials for all the group's query rows, writes the
output and sets its counter back to zero. The counters live in one zeroed buffer per device that
every call leaves at zero, so a CUDA graph can replay the op; calls on one device must therefore not
run concurrently on two streams. The price is that one program per (sequence, kv head) reads all
num_splits x query rows x head_dim fp32 partials from L2, where the merge kernel spread them over a
program per query row and head.

The number of splits is fixed on the host (from the batch size and max_context_len, so a CUDA graph
captured with max_context_len = max_model_len stays valid), but each sequence spreads its own
context over them on the device: a short context in a graph sized for a long one still uses all
its splits rather than leaving the work to the first. A split past a sequence's context (or past a
query row's position) has seen no key: it still stores an LSE of -inf and a zero partial, which the
merge weighs 0, and still counts itself in, so the last one to arrive knows every split is stored.

The kernel is launched with programmatic dependent launch where the device has it (see
hotpath/ops/triton_utils.py): everything it reads, the query, the cache, the lengths and the block
tables, is written by the step's earlier kernels or its inputs, so it waits at its start.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotpath.ops.attention.triton_common import (
    LOG2E,
    attend_tile,
    dot_precision,
    next_power_of_2,
)
from hotpath.ops.triton_utils import pdl_enabled, pdl_launch_dependents, pdl_wait, sm_count

# Measured on an H200 (hotpath.ops.bench_kernels: batch 1 and 64, Qwen3-8B heads, bf16): decode
# is bound by how many bytes each SM keeps in flight: 16 KB key tiles (64 keys of head_dim 128; with
# two pipeline stages three programs' K/V tiles fit in an SM's shared memory) beat 32 KB ones, and
# splitting the context until there are about four programs per SM beats two. Splits shorter than
# 64 tokens stop paying for their merge; once the batch alone gives every SM a program, splitting
# only costs. (Measured with the merge as a second kernel, before it moved into the split kernel.)
PROGRAMS_PER_SM = 4
MIN_SPLIT_TOKENS = 64
MAX_SPLITS = 128
TILE_BYTES = 64 * 128 * 2
# One merge counter per (sequence, kv head) of a split call. The automatic split choice splits only
# while num_seqs * num_kv_heads is below the SM count, so this binds only a forced num_splits.
MAX_SPLIT_GROUPS = 8192
# The merge walks a group's query rows in blocks whose fp32 accumulator is at most 4 registers a
# thread, loading 32 registers a thread of partials at once (as many splits as fit, for L2's
# latency). Registers limit the programs an SM holds as much as shared memory does, so the merge
# must not raise the kernel's count: compiled for sm_90 (bf16, 4 warps) this keeps batch-1 decode
# at head_dim 128, group 4 at the split work's own 88-89 registers, and no shape from 1 q head x 1
# token to 8 x 8 per kv head (head_dim 64 to 256) spills.
MERGE_ACC_ELEMS_PER_WARP = 4 * 32
MERGE_LOAD_ELEMS_PER_WARP = 32 * 32

_split_counters: dict[torch.device, torch.Tensor] = {}


def _counters(device: torch.device) -> torch.Tensor:
    """The device's merge counters: allocated once (zeros), left at zero by every call."""
    if device not in _split_counters:
        _split_counters[device] = torch.zeros(MAX_SPLIT_GROUPS, dtype=torch.int32, device=device)
    return _split_counters[device]


@triton.jit
def _merge_splits(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    q_start,
    q_len,
    kv_head,
    num_heads,
    num_splits,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    MERGE_M: tl.constexpr,
    LSE_CHUNK: tl.constexpr,
    SPLIT_CHUNK: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
    """out = sum over splits of part_out * 2^(lse - max lse) / sum of the weights, for every query
    row of one (sequence, kv head), MERGE_M rows at a time so that a wide group (many q heads per kv
    head, k+1 query tokens) does not need more registers than the split itself. The partials were
    stored by other programs: read with .cg, from L2, where their stores are, not from this SM's
    L1."""
    d = tl.arange(0, HEAD_DIM_PAD)
    for r0 in range(0, q_len * GROUP, MERGE_M):
        rows = r0 + tl.arange(0, MERGE_M)  # as in the split: query token * GROUP + head in group
        tok = rows // GROUP
        head = kv_head * GROUP + rows % GROUP
        row_ok = tok < q_len
        token = (q_start + tok).to(tl.int64)
        base = (token * num_heads + head) * num_splits  # [MERGE_M] each row's first partial

        lse_max = tl.full([MERGE_M], float("-inf"), tl.float32)
        for s0 in range(0, num_splits, LSE_CHUNK):
            s = s0 + tl.arange(0, LSE_CHUNK)
            lse = tl.load(
                part_lse_ptr + base[None, :] + s[:, None],
                mask=(s < num_splits)[:, None] & row_ok[None, :],
                other=float("-inf"),
                cache_modifier=".cg",
            )  # [LSE_CHUNK, MERGE_M]
            lse_max = tl.maximum(lse_max, tl.max(lse, 0))
        # every real row has seen its own key in some split; padding rows (never stored) shift by 0
        lse_max = tl.where(row_ok, lse_max, 0.0)

        acc = tl.zeros([MERGE_M, HEAD_DIM_PAD], tl.float32)
        weight_sum = tl.zeros([SPLIT_CHUNK, MERGE_M], tl.float32)
        # chunks of splits: several splits' loads in flight, but not so many that they spill
        for s0 in range(0, num_splits, SPLIT_CHUNK):
            c = s0 + tl.arange(0, SPLIT_CHUNK)
            c_ok = (c < num_splits)[:, None] & row_ok[None, :]  # [SPLIT_CHUNK, MERGE_M]
            part_idx = base[None, :] + c[:, None]
            lse = tl.load(
                part_lse_ptr + part_idx, mask=c_ok, other=float("-inf"), cache_modifier=".cg"
            )
            weight = tl.exp2(lse - lse_max[None, :])  # empty splits weigh 0
            part = tl.load(
                part_out_ptr + part_idx[:, :, None] * HEAD_DIM + d[None, None, :],
                mask=c_ok[:, :, None] & (d < HEAD_DIM)[None, None, :],
                other=0.0,
                cache_modifier=".cg",
            )  # [SPLIT_CHUNK, MERGE_M, HEAD_DIM_PAD]
            acc += tl.sum(part * weight[:, :, None], 0)
            weight_sum += weight
        total = tl.where(row_ok, tl.sum(weight_sum, 0), 1.0)
        out = acc / total[:, None]
        tl.store(
            out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & (d[None, :] < HEAD_DIM),
        )


@triton.jit
def _decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    cu_query_lens_ptr,
    context_lens_ptr,
    block_tables_ptr,
    out_ptr,
    part_out_ptr,  # [num_tokens, num_heads, num_splits, HEAD_DIM] fp32 (unused if DIRECT)
    part_lse_ptr,  # [num_tokens, num_heads, num_splits] fp32, log2 units (unused if DIRECT)
    counter_ptr,  # [>= num_seqs * num_kv_heads] int32, zero between calls (unused if DIRECT)
    scale_log2,
    num_heads,
    num_splits,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_bt,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    DIRECT: tl.constexpr,
    MERGE_M: tl.constexpr,
    LSE_CHUNK: tl.constexpr,
    SPLIT_CHUNK: tl.constexpr,
    PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # the next kernel may start launching now; everything below reads the step's inputs or what
    # earlier kernels wrote (the query, the cache), so wait before any load or store
    pdl_launch_dependents(USE_PDL)
    pdl_wait(USE_PDL)
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_start = tl.load(cu_query_lens_ptr + seq)
    q_len = tl.load(cu_query_lens_ptr + seq + 1) - q_start
    ctx = tl.load(context_lens_ptr + seq)

    rows = tl.arange(0, BLOCK_M)  # row = query token * GROUP + head within the group
    tok = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = tok < q_len
    q_pos = ctx - q_len + tok
    d = tl.arange(0, HEAD_DIM_PAD)
    row_mask = row_ok[:, None] & (d[None, :] < HEAD_DIM)
    token = (q_start + tok).to(tl.int64)
    q = tl.load(
        q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
        mask=row_mask,
        other=0.0,
    )

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    block_table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    split_len = tl.cdiv(tl.cdiv(ctx, num_splits), BLOCK_N) * BLOCK_N  # whole tiles per split
    start = split * split_len
    end = tl.minimum(start + split_len, ctx)
    for n0 in range(start, end, BLOCK_N):
        acc, l_i, m_i = attend_tile(
            acc, l_i, m_i, q, q_pos, k_cache_ptr, v_cache_ptr, block_table, n0, end, kv_head,
            stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, scale_log2, d,
            True, BLOCK_N, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_PAD, PRECISION,
        )

    if DIRECT:
        # one split holds the whole context, so every real row has seen at least its own key
        out = acc / l_i[:, None]
        tl.store(
            out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_mask,
        )
    else:
        # a split past a row's position (or past the context) has seen nothing: weight 0. It
        # stores that too, and arrives at the counter like the others.
        seen = l_i > 0.0
        l_safe = tl.where(seen, l_i, 1.0)
        lse = tl.where(seen, m_i + tl.log2(l_safe), float("-inf"))
        part = (token * num_heads + head) * num_splits + split
        tl.store(part_lse_ptr + part, lse, mask=row_ok)
        tl.store(
            part_out_ptr + part[:, None] * HEAD_DIM + d[None, :], acc / l_safe[:, None],
            mask=row_mask,
        )
        # every thread's partials are stored before the (one-thread, acq_rel) atomic publishes
        # them; the program that arrives last acquires every other split's
        tl.debug_barrier()
        group_idx = seq * tl.num_programs(1) + kv_head
        arrived = tl.atomic_add(counter_ptr + group_idx, 1, sem="acq_rel", scope="gpu")
        if arrived == num_splits - 1:
            _merge_splits(
                part_out_ptr, part_lse_ptr, out_ptr, q_start, q_len, kv_head, num_heads,
                num_splits, stride_ot, stride_oh, GROUP, MERGE_M, LSE_CHUNK, SPLIT_CHUNK,
                HEAD_DIM, HEAD_DIM_PAD,
            )
            tl.store(counter_ptr + group_idx, 0)


def choose_num_splits(
    num_seqs: int, num_kv_heads: int, max_context_len: int, device: torch.device
) -> int:
    """Enough splits to give every SM about PROGRAMS_PER_SM programs, none (at the longest
    context) shorter than MIN_SPLIT_TOKENS; one split once the batch alone fills the SMs."""
    programs = num_seqs * num_kv_heads
    num_sms = sm_count(device)
    if programs >= num_sms:
        return 1
    wanted = triton.cdiv(PROGRAMS_PER_SM * num_sms, programs)
    return max(1, min(wanted, triton.cdiv(max_context_len, MIN_SPLIT_TOKENS), MAX_SPLITS))


def choose_block_n(head_dim_pad: int, elem_size: int, tokens_per_split: int) -> int:
    """Keys per tile: TILE_BYTES of keys, fewer when the splits are shorter."""
    block_n = max(16, TILE_BYTES // (head_dim_pad * elem_size))
    return max(16, min(block_n, next_power_of_2(tokens_per_split)))


def paged_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] (any strides, head_dim contiguous)
    v_cache: torch.Tensor,
    cu_query_lens: torch.Tensor,  # [num_seqs + 1] int32
    context_lens: torch.Tensor,  # [num_seqs] int32
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    scale: float,
    max_query_len: int,
    max_context_len: int,
    *,
    num_splits: int | None = None,  # tuning and tests: force the number of context splits
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Same contract as reference.paged_attention; meant for small max_query_len (decode, verify)."""
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    num_seqs = context_lens.shape[0]
    assert q.stride(2) == 1 and k_cache.stride(3) == 1 and v_cache.stride(3) == 1
    assert num_heads % num_kv_heads == 0
    group = num_heads // num_kv_heads
    head_dim_pad = max(16, next_power_of_2(head_dim))
    block_m = max(16, next_power_of_2(max_query_len * group))
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_context_len, q.device)
    if block_n is None:
        block_n = choose_block_n(
            head_dim_pad, q.element_size(), triton.cdiv(max_context_len, num_splits)
        )
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return out
    direct = num_splits == 1
    # the merge's rows at a time: not padded for tensor cores, capped for registers
    merge_m = min(next_power_of_2(max_query_len * group),
                  max(1, MERGE_ACC_ELEMS_PER_WARP * num_warps // head_dim_pad))
    merge_elems = MERGE_LOAD_ELEMS_PER_WARP * num_warps
    splits_pad = next_power_of_2(num_splits)
    if direct:
        part_out = part_lse = counters = out  # unused
    else:
        if num_seqs * num_kv_heads > MAX_SPLIT_GROUPS:
            raise ValueError(
                f"split decode attention takes at most {MAX_SPLIT_GROUPS} (sequence, kv head) "
                f"pairs, got {num_seqs} x {num_kv_heads}; use num_splits=1"
            )
        part_out = torch.empty(
            (num_tokens, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
        part_lse = torch.empty(
            (num_tokens, num_heads, num_splits), dtype=torch.float32, device=q.device
        )
        counters = _counters(q.device)
    use_pdl = pdl_enabled(q.device)
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, cu_query_lens, context_lens, block_tables,
        out, part_out, part_lse, counters,
        scale * LOG2E, num_heads, num_splits,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, DIRECT=direct,
        MERGE_M=merge_m,
        LSE_CHUNK=max(1, min(splits_pad, merge_elems // merge_m)),
        SPLIT_CHUNK=max(1, min(splits_pad, merge_elems // (merge_m * head_dim_pad))),
        PRECISION=dot_precision(q.dtype), USE_PDL=use_pdl,
        num_warps=num_warps, num_stages=num_stages, launch_pdl=use_pdl,
    )
    return out
