"""One-shot all-reduce, fused with the residual add and RMSNorm (and optionally the per-token fp8
quantization of the normed output), over symmetric peer buffers, for decode-sized messages.

Each rank launches the same grid over its own partial x [T, H]; program `pid` owns rows pid,
pid + P, ... (P = programs of the launch, at most MAX_PROGRAMS). A program:

  1. start barrier: tells every peer's program `pid` it has arrived, waits until all have;
  2. writes its rows of x into this rank's symmetric buffer;
  3. mid barrier: the same handshake again, now meaning "my rows are written";
  4. reads its rows from every rank's buffer (its own included), sums them in fp32 in rank order,
     and writes the reduced row, or the new residual (+ residual) and the normed row (x weight),
     and with fp8 the quantized normed row and its scale.

Why these two barriers suffice. The mid barrier orders every rank's writes of rows R before any
rank's reads of rows R (each barrier is program-to-program, and every rank's program `pid` owns
the same rows, since every rank launches the same grid on the same shape). The start barrier keeps
a rank from overwriting its buffer while a peer still reads the previous call's data from it: a
peer's program can arrive at call k+1 only after that peer's call-k kernel has finished (the calls
run in order on one stream, and this kernel does not use PDL), and so after its reads of call k.
So no end barrier and no double buffer are needed, the grid may change from call to call, and
nothing depends on a host-side counter (which a CUDA graph would freeze at its capture value).

Signals. Rank r's signal pad holds a uint32 flag per (barrier, program, sender). To signal peer p,
program `pid` of rank r swaps p's flag [barrier, pid, r] from 0 to 1 (atomic compare-and-swap,
release, system scope, retried while the previous signal there is not yet consumed); to wait, it
swaps its own flags [barrier, pid, q] from 1 back to 0 for every q (acquire, system scope,
retried until set). A flag is back at 0 after every completed barrier, so the pads need no reset
between calls or graph replays. A CTA barrier (tl.debug_barrier) before the signal makes every
thread's stores part of what the release publishes, and one after the wait holds every thread
until the acquire has happened. Peer rows are loaded with the ".cv" cache modifier (fetched
again, never served from a cached line of a previous call's bytes), 16 bytes a load. Only Triton
atomics and cache modifiers are used, no inline PTX, so the kernel compiles for AMD as is (there
the same CAS with system scope, and the backend's uncached load).

`sync=False` skips both barriers: the single-process interpreter tests run the ranks one after
another, where a barrier would wait forever for ranks that have not started (they write every
rank's partial in a first pass, then check the second).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotpath.ops.allreduce.peers import DTYPES, MAX_HIDDEN, MAX_PROGRAMS, PeerBuffers
from hotpath.ops.quant import reference as quant_reference
from hotpath.ops.quant.triton_quant import _scale_of, _to_fp8
from hotpath.ops.triton_utils import row_warps, tl_dtype

FLAT_ROW = 4096  # the row width a plain all-reduce splits its flat message into
MODE_SUM, MODE_NORM, MODE_NORM_FP8 = 0, 1, 2


@triton.jit
def _signal(flag_ptr):
    while tl.atomic_cas(flag_ptr, 0, 1, sem="release", scope="sys") != 0:
        pass


@triton.jit
def _wait(flag_ptr):
    while tl.atomic_cas(flag_ptr, 1, 0, sem="acquire", scope="sys") != 1:
        pass


@triton.jit
def _barrier(signal_ptrs, rank, pid, WHICH: tl.constexpr, WORLD: tl.constexpr, PROGRAMS: tl.constexpr):
    """Program `pid` of every rank meets here (see the module docstring)."""
    tl.debug_barrier()
    slot = (WHICH * PROGRAMS + pid) * WORLD
    for p in tl.static_range(WORLD):
        peer_pad = tl.load(signal_ptrs + p).to(tl.pointer_type(tl.int32))
        _signal(peer_pad + slot + rank)
    my_pad = tl.load(signal_ptrs + rank).to(tl.pointer_type(tl.int32))
    for p in tl.static_range(WORLD):
        _wait(my_pad + slot + p)
    tl.debug_barrier()


@triton.jit
def _one_shot_kernel(
    x_ptr,  # [T, H] this rank's partial (MODE_SUM: the flat message, in place)
    residual_ptr,  # [T, H]
    weight_ptr,  # [H]
    out_ptr,  # [T, H]: the sum (MODE_SUM), the normed row, or its fp8
    res_out_ptr,  # [T, H] the new residual
    scale_ptr,  # [T] fp32 per-token fp8 scales
    buffer_ptrs,  # [WORLD] int64 each rank's symmetric buffer address
    signal_ptrs,  # [WORLD] int64 each rank's signal pad address
    rank,
    numel,  # elements of the message (MODE_SUM's last row is partial)
    T,
    H,
    eps,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    WORLD: tl.constexpr,
    MODE: tl.constexpr,
    SUM_DTYPE: tl.constexpr,  # x + residual rounds to it (the reference's)
    NORM_DTYPE: tl.constexpr,  # weight * normed rounds to it (promoted with the weight's)
    BLOCK: tl.constexpr,
    SYNC: tl.constexpr,
    PROGRAMS: tl.constexpr,  # signal pad slots a barrier (MAX_PROGRAMS)
    FP8_MAX: tl.constexpr,
    MIN_SCALE: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    dtype = x_ptr.dtype.element_ty
    # the buffers' bases are allocation-aligned; saying so lets the compiler vectorize their rows
    my_buf = tl.multiple_of(tl.load(buffer_ptrs + rank).to(tl.pointer_type(dtype)), 16)
    if SYNC:
        _barrier(signal_ptrs, rank, pid, 0, WORLD, PROGRAMS)
    for row in range(pid, T, nprog):
        offs = tl.cast(row, tl.int64) * H + cols
        mask = (cols < H) & (offs < numel)
        x = tl.load(x_ptr + tl.cast(row, tl.int64) * stride_x + cols, mask=mask, other=0.0)
        tl.store(my_buf + offs, x, mask=mask)
    if SYNC:
        _barrier(signal_ptrs, rank, pid, 1, WORLD, PROGRAMS)
    if MODE != 0:
        w = tl.load(weight_ptr + cols, mask=cols < H, other=0.0).to(tl.float32)
    for row in range(pid, T, nprog):
        row64 = tl.cast(row, tl.int64)
        offs = row64 * H + cols
        mask = (cols < H) & (offs < numel)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for p in tl.static_range(WORLD):
            peer_buf = tl.multiple_of(tl.load(buffer_ptrs + p).to(tl.pointer_type(dtype)), 16)
            acc += tl.load(peer_buf + offs, mask=mask, other=0.0, cache_modifier=".cv").to(tl.float32)
        total = acc.to(dtype)
        if MODE == 0:
            tl.store(out_ptr + row64 * stride_o + cols, total, mask=mask)
        else:
            r = tl.load(residual_ptr + row64 * stride_r + cols, mask=mask, other=0.0)
            summed = (total.to(tl.float32) + r.to(tl.float32)).to(SUM_DTYPE)
            tl.store(res_out_ptr + row64 * stride_ro + cols, summed, mask=mask)
            s = summed.to(tl.float32)
            rstd = tl.rsqrt(tl.sum(s * s, 0) / H + eps)
            normed = ((s * rstd).to(SUM_DTYPE).to(tl.float32) * w).to(NORM_DTYPE)
            if MODE == 1:
                tl.store(out_ptr + row64 * stride_o + cols, normed.to(out_ptr.dtype.element_ty), mask=mask)
            else:
                nf = normed.to(tl.float32)
                scale = _scale_of(tl.max(tl.abs(nf), axis=0), FP8_MAX, MIN_SCALE)
                q = _to_fp8(nf, scale, FP8_MAX, out_ptr.dtype.element_ty)
                tl.store(out_ptr + row64 * stride_o + cols, q, mask=mask)
                tl.store(scale_ptr + row64, scale)


def _check(x: torch.Tensor, peers: PeerBuffers, name: str = "x") -> None:
    if x.dtype not in DTYPES:
        raise ValueError(f"the one-shot all-reduce takes float32, float16 or bfloat16, not {x.dtype}")
    if not peers.fits(x):
        raise ValueError(f"{name}'s {x.numel() * x.element_size()} bytes do not fit the "
                         f"{peers.capacity}-byte peer buffers (larger messages take the NCCL path)")
    if x.device != peers.buffer_ptrs.device:
        raise ValueError(f"{name} is on {x.device} but the peer buffers' pointers are on {peers.buffer_ptrs.device}")


def _check_rows(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, peers: PeerBuffers) -> None:
    _check(x, peers)
    if x.dim() != 2 or residual.shape != x.shape or weight.shape != x.shape[-1:]:
        raise ValueError(f"x {tuple(x.shape)}, residual {tuple(residual.shape)} and the norm weight "
                         f"{tuple(weight.shape)} must be [tokens, hidden], [tokens, hidden], [hidden]")
    if x.shape[1] > MAX_HIDDEN:
        raise ValueError(f"hidden size {x.shape[1]} is over the one-shot kernel's {MAX_HIDDEN}")


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _launch(x, residual, weight, out, res_out, scale, eps, peers, T, H, mode, sync, fp8_max=1.0):
    """x, residual, out, res_out: [T, H] row-major with unit column stride (MODE_SUM: flat, H the
    row width, the last row partial)."""
    if T == 0:
        return
    block = triton.next_power_of_2(H)
    sum_dtype = torch.promote_types(x.dtype, residual.dtype)
    norm_dtype = torch.promote_types(weight.dtype, sum_dtype)
    stride = lambda t: t.stride(0) if t.dim() == 2 else H  # noqa: E731
    _one_shot_kernel[(min(T, MAX_PROGRAMS),)](
        x, residual, weight, out, res_out, scale, peers.buffer_ptrs, peers.signal_ptrs, peers.rank,
        x.numel(), T, H, eps, stride(x), stride(residual), stride(out), stride(res_out),
        WORLD=peers.world, MODE=mode, SUM_DTYPE=tl_dtype(sum_dtype), NORM_DTYPE=tl_dtype(norm_dtype),
        BLOCK=block, SYNC=sync, PROGRAMS=MAX_PROGRAMS, FP8_MAX=fp8_max,
        MIN_SCALE=quant_reference.MIN_SCALE_FACTOR / fp8_max, num_warps=row_warps(block),
    )


def all_reduce(x: torch.Tensor, peers: PeerBuffers, *, sync: bool = True) -> torch.Tensor:
    """x <- the sum over ranks (fp32 in rank order, rounded once), in place; returns x."""
    _check(x, peers)
    if not x.is_contiguous():
        raise ValueError("the one-shot all-reduce works in place on a contiguous tensor")
    flat = x.view(-1)  # [numel]
    width = min(FLAT_ROW, triton.next_power_of_2(max(flat.numel(), 1)))
    _launch(flat, flat, flat, flat, flat, flat, 0.0, peers, triton.cdiv(flat.numel(), width), width,
            MODE_SUM, sync)
    return x


def all_reduce_add_rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden] this rank's partial
    residual: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    peers: PeerBuffers,
    *,
    sync: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(sum_ranks(x) + residual) * weight, sum_ranks(x) + residual), like the reference."""
    _check_rows(x, residual, weight, peers)
    x, residual = _rows(x), _rows(residual)
    T, H = x.shape
    sum_dtype = torch.promote_types(x.dtype, residual.dtype)
    out = torch.empty((T, H), dtype=torch.promote_types(weight.dtype, sum_dtype), device=x.device)  # [T, H]
    summed = torch.empty((T, H), dtype=sum_dtype, device=x.device)  # [T, H]
    _launch(x, residual, weight, out, summed, out, eps, peers, T, H, MODE_NORM, sync)
    return out, summed


def all_reduce_add_rms_norm_fp8(
    x: torch.Tensor,  # [num_tokens, hidden]
    residual: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    peers: PeerBuffers,
    out_dtype: torch.dtype = torch.float8_e4m3fn,
    *,
    sync: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # [T, H] fp8, [T] fp32, [T, H]
    """(per-token fp8 of the normed output, its scales, the new residual), like the reference."""
    _check_rows(x, residual, weight, peers)
    if out_dtype not in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        raise ValueError(f"the fp8 output must be float8_e4m3fn or float8_e4m3fnuz, not {out_dtype}")
    x, residual = _rows(x), _rows(residual)
    T, H = x.shape
    out = torch.empty((T, H), dtype=out_dtype, device=x.device)  # [T, H] fp8
    scale = torch.empty(T, dtype=torch.float32, device=x.device)  # [T]
    summed = torch.empty((T, H), dtype=torch.promote_types(x.dtype, residual.dtype), device=x.device)  # [T, H]
    _launch(x, residual, weight, out, summed, scale, eps, peers, T, H, MODE_NORM_FP8, sync,
            quant_reference.fp8_max(out_dtype))
    return out, scale, summed
