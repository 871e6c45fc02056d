"""GGUF weights kept quantized: the layout the kernels read, made from the GGUF blocks as stored,
and its torch reference (dequantization and the linear).

Every supported GGUF type is one form, `w = s * (q - offset) + b` for an integer code q per
weight, with the scale s and the term b per group of `group` columns:

    s = d[g // sub] * sc[g]     (sc: the K-quants' per-group integer scales; else s = d[g])
    b = dm[g // sub] * mc[g]    (K-quants with a min: dm = -dmin, mc = the integer mins;
                                 Q4_1 / Q5_1: b = m[g]; the rest: no b)

computed in float32 exactly as the `gguf` package (llama.cpp's gguf-py) dequantizes, so
`dequantize(repack(blocks))` equals gguf's dequantization bit for bit (d * sc and dmin * m are
exact in float32: an fp16 times a 6- or 8-bit integer).

The layout (`GGUFWeight`), rows [N] in their natural order, input columns [K] in runs of 128
(K padded to Kp, a multiple of 128, for the codes only: the padding's codes are 0 and no scale
covers them):
    codes  int32 [N, Kp / 8] for 4-6-bit codes (their low 4 bits), sliced as the int4 kernels'
           layout is (hotpath.ops.quant.reference): nibble j of word i of a 128-column run (16
           words) holds column 16 j + i of the run, so nibble j of the run's words is 16
           contiguous columns inside one scale group; int8 [N, K] for 8-bit codes
    high   the bits above the low 4, a word's worth per code word, in the same order: uint8
           [N, Kp / 8] (5-bit: the code of nibble j at bit j), int16 [N, Kp / 8] (6-bit: at bits
           2j, 2j + 1); [N, 0] for 4- and 8-bit codes
    d      fp16 [N, K / (group sub)]           dm  fp16 [N, K / (group sub)] or [N, 0]
    sc     uint8 / int8 [N, K / group] or [N, 0]   mc  uint8 [N, K / group] or [N, 0]
K is d's columns times group * sub. Bits a weight: Q8_0 8.5, Q6_K 6.56, Q5_0 5.5, Q4_K 4.63
(stored: 4.5, its 6-bit scales and mins unpacked to bytes), Q4_0 4.5 (plus the padding where K is
not a multiple of 128: legacy types only, the K-quants' 256-column superblocks never need it);
every tensor of the layout is [N, ...], so the stacked projections of a fused linear (qkv,
gate_up) of one type concatenate along N.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

QK_K = 256  # the K-quants' superblock
RUN = 128  # columns of a run of the sliced code layout (16 words of 8 nibbles)


@dataclass(frozen=True)
class GGUFFormat:
    name: str  # gguf.GGMLQuantizationType's name
    type_id: int  # its value
    block: int  # columns of one stored block
    block_bytes: int  # bytes of one stored block
    bits: int  # code width: 4, 5, 6 or 8
    group: int  # columns a scale covers
    sub: int  # groups a d (and dm) covers: 1, or the K-quants' groups per superblock
    offset: int  # subtracted from the codes
    sub_scales: bool  # s = d * sc (and b = dm * mc with a min)
    has_min: bool  # a b term


FORMATS = {f.name: f for f in (
    GGUFFormat("Q4_0", 2, 32, 18, 4, 32, 1, 8, False, False),
    GGUFFormat("Q4_1", 3, 32, 20, 4, 32, 1, 0, False, True),
    GGUFFormat("Q5_0", 6, 32, 22, 5, 32, 1, 16, False, False),
    GGUFFormat("Q5_1", 7, 32, 24, 5, 32, 1, 0, False, True),
    GGUFFormat("Q8_0", 8, 32, 34, 8, 32, 1, 0, False, False),
    GGUFFormat("Q4_K", 12, QK_K, 144, 4, 32, 8, 0, True, True),
    GGUFFormat("Q5_K", 13, QK_K, 176, 5, 32, 8, 0, True, True),
    GGUFFormat("Q6_K", 14, QK_K, 210, 6, 16, 16, 32, True, False),
)}
FORMATS_BY_ID = {f.type_id: f for f in FORMATS.values()}


@dataclass(frozen=True)
class GGUFWeight:
    """A [N, K] weight in the layout above."""
    fmt: GGUFFormat
    codes: torch.Tensor
    high: torch.Tensor
    d: torch.Tensor
    dm: torch.Tensor
    sc: torch.Tensor
    mc: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return self.d.shape[0], self.d.shape[1] * self.fmt.group * self.fmt.sub

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"codes": self.codes, "high": self.high, "d": self.d, "dm": self.dm, "sc": self.sc,
                "mc": self.mc}

    def bits_per_weight(self) -> float:
        N, K = self.shape
        return 8 * sum(t.numel() * t.element_size() for t in self.tensors().values()) / (N * K)


def empty_weight(fmt: GGUFFormat | str, N: int, K: int, device: torch.device | None = None) -> GGUFWeight:
    """An uninitialised [N, K] weight in the layout."""
    fmt = FORMATS[fmt] if isinstance(fmt, str) else fmt
    check_shape(fmt, N, K)
    groups = K // fmt.group
    supers = groups // fmt.sub

    def t(cols: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(N, cols, dtype=dtype, device=device)

    words = padded_k(K) // 8
    return GGUFWeight(
        fmt,
        t(K, torch.int8) if fmt.bits == 8 else t(words, torch.int32),
        t(words if fmt.bits in (5, 6) else 0, {5: torch.uint8, 6: torch.int16}.get(fmt.bits, torch.uint8)),
        t(supers, torch.float16),
        t(supers if fmt.has_min else 0, torch.float16),
        t(groups if fmt.sub_scales else 0, torch.int8 if fmt.name == "Q6_K" else torch.uint8),
        t(groups if fmt.sub_scales and fmt.has_min else 0, torch.uint8),
    )


def padded_k(K: int) -> int:
    """K rounded up to whole 128-column runs of the sliced code layout."""
    return -(-K // RUN) * RUN


def _slice_index(K: int, device) -> torch.Tensor:  # [Kp / 8, 8]
    """[w, j] -> the column nibble j of code word w holds (columns past K: padding)."""
    w = torch.arange(padded_k(K) // 8, device=device)
    j = torch.arange(8, device=device)
    return ((w // 16) * RUN + w % 16)[:, None] + 16 * j[None, :]


def check_shape(fmt: GGUFFormat, N: int, K: int) -> None:
    if K % fmt.block:
        raise ValueError(f"a {fmt.name} weight needs in_features a multiple of {fmt.block}, got {K}")


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 at bytes start, start + 1 of every block [..., bytes] -> [...] float16."""
    return blocks[..., start:start + 2].contiguous().view(torch.float16)[..., 0]


def _bits(b: torch.Tensor, width: int) -> torch.Tensor:
    """uint8 [..., n] -> [..., n, 8 / width]: field i of each byte (bits width i ...) as int32."""
    shifts = torch.arange(0, 8, width, device=b.device, dtype=torch.int32)
    return (b.to(torch.int32)[..., None] >> shifts) & ((1 << width) - 1)


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The K-quants' 12 bytes of packed 6-bit scales and mins [..., 12] -> ([..., 8], [..., 8])."""
    s = s.to(torch.int32)
    d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _legacy_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """Q4_0/Q4_1/Q5_x: [..., 16] bytes, column j in the low nibble of byte j, j + 16 in the high
    one -> [..., 32] in column order."""
    q = qs.to(torch.int32)
    return torch.cat([q & 15, q >> 4], dim=-1)


def unpack_blocks(fmt: GGUFFormat, raw: torch.Tensor, K: int) -> dict[str, torch.Tensor]:
    """The GGUF blocks of an [N, K] tensor (uint8 [N, K / block * block_bytes]) -> the codes
    (int32 [N, K], 0 .. 2^bits - 1, or -128 .. 127 for Q8_0) and the per-group tensors."""
    check_shape(fmt, raw.shape[0], K)
    N, nb = raw.shape[0], K // fmt.block
    if raw.shape[1] != nb * fmt.block_bytes:
        raise ValueError(f"{fmt.name} [{N}, {K}] takes {nb * fmt.block_bytes} bytes a row, got {raw.shape[1]}")
    b = raw.reshape(N, nb, fmt.block_bytes)
    empty_f16 = torch.empty(N, 0, dtype=torch.float16, device=raw.device)
    empty_u8 = torch.empty(N, 0, dtype=torch.uint8, device=raw.device)
    out = {"dm": empty_f16, "sc": empty_u8, "mc": empty_u8}
    name = fmt.name
    if name == "Q8_0":
        out["d"] = _f16(b, 0)
        q = b[..., 2:].contiguous().view(torch.int8).to(torch.int32)
    elif name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        out["d"] = _f16(b, 0)
        at = 2
        if fmt.has_min:
            out["dm"], at = _f16(b, 2), 4
        if fmt.bits == 5:
            qh = _bits(b[..., at:at + 4], 1).reshape(N, nb, 32)  # bit i of the little-endian u32
            q = _legacy_nibbles(b[..., at + 4:]) | (qh << 4)
        else:
            q = _legacy_nibbles(b[..., at:])
    elif name in ("Q4_K", "Q5_K"):
        d, dmin = _f16(b, 0), _f16(b, 2)
        sc, mn = _k_scales(b[..., 4:16])
        out["d"], out["dm"] = d, -dmin
        out["sc"], out["mc"] = sc.to(torch.uint8), mn.to(torch.uint8)
        qs = b[..., -128:].to(torch.int32).reshape(N, nb, 4, 32)
        q = torch.stack([qs & 15, qs >> 4], dim=3).reshape(N, nb, 8, 32)  # 64 columns a chunk
        if name == "Q5_K":
            qh = _bits(b[..., 16:48], 1)  # [N, nb, 32, 8]: bit i of byte j: column 32 i + j
            q = q | (qh.transpose(-1, -2) << 4)
    elif name == "Q6_K":
        ql = b[..., 0:128].to(torch.int32).reshape(N, nb, 2, 1, 64)
        ql = torch.cat([ql & 15, ql >> 4], dim=3).reshape(N, nb, 8, 32)
        qh = _bits(b[..., 128:192], 2).reshape(N, nb, 2, 32, 4).permute(0, 1, 2, 4, 3)
        q = ql | (qh.reshape(N, nb, 8, 32) << 4)
        out["sc"] = b[..., 192:208].contiguous().view(torch.int8)
        out["d"] = _f16(b, 208)
    else:
        raise ValueError(f"GGUF type {name} is not supported")
    out["q"] = q.reshape(N, K)
    return {k: v.reshape(N, -1) for k, v in out.items()}


def repack(fmt: GGUFFormat, raw: torch.Tensor, K: int) -> GGUFWeight:
    """The GGUF blocks of an [N, K] tensor -> the kernels' layout."""
    t = unpack_blocks(fmt, raw, K)
    q = t.pop("q")  # [N, K] int32
    N = q.shape[0]
    if fmt.bits == 8:
        codes = q.to(torch.int8)
        high = torch.empty(N, 0, dtype=torch.uint8, device=q.device)
    else:
        # [N, Kp / 8, 8]: the codes in the sliced order (0 in the padding)
        sliced = torch.nn.functional.pad(q, (0, padded_k(K) - K))[:, _slice_index(K, q.device)]
        words = ((sliced & 15).to(torch.int64) << (4 * torch.arange(8, device=q.device))).sum(-1)
        codes = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # [N, Kp / 8]
        width = fmt.bits - 4
        if width:
            bits = ((sliced >> 4) << (width * torch.arange(8, device=q.device, dtype=torch.int32))).sum(-1)
            high = (bits.to(torch.uint8) if width == 1 else
                    torch.where(bits >= 2**15, bits - 2**16, bits).to(torch.int16))  # [N, Kp / 8]
        else:
            high = torch.empty(N, 0, dtype=torch.uint8, device=q.device)
    return GGUFWeight(fmt, codes.contiguous(), high.contiguous(), t["d"].contiguous(),
                      t["dm"].contiguous(), t["sc"].contiguous(), t["mc"].contiguous())


def codes(w: GGUFWeight) -> torch.Tensor:
    """The integer codes q [N, K] int32 of the layout."""
    N, K = w.shape
    if w.fmt.bits == 8:
        return w.codes.to(torch.int32)
    shifts = torch.arange(8, device=w.codes.device, dtype=torch.int32)
    sliced = (w.codes[..., None] >> (4 * shifts)) & 15  # [N, Kp / 8, 8]
    width = w.fmt.bits - 4
    if width:
        sliced = sliced | (((w.high.to(torch.int32)[..., None] >> (width * shifts)) & ((1 << width) - 1)) << 4)
    q = torch.empty(N, padded_k(K), dtype=torch.int32, device=w.codes.device)
    q[:, _slice_index(K, w.codes.device)] = sliced
    return q[:, :K]


def group_terms(w: GGUFWeight) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(s, b) float32 [N, K / group] (b None without a min), as gguf computes them."""
    fmt = w.fmt
    s = w.d.float().repeat_interleave(fmt.sub, dim=1)
    b = w.dm.float().repeat_interleave(fmt.sub, dim=1) if fmt.has_min else None
    if fmt.sub_scales:
        s = s * w.sc.float()
        if b is not None:
            b = b * w.mc.float()
    return s, b


def dequantize(w: GGUFWeight) -> torch.Tensor:  # [N, K] float32
    fmt = w.fmt
    N, K = w.shape
    s, b = group_terms(w)
    q = (codes(w) - fmt.offset).float().reshape(N, K // fmt.group, fmt.group)
    out = s[..., None] * q
    if b is not None:
        out = out + b[..., None]
    return out.reshape(N, K)


def dequantize_rows(w: GGUFWeight, rows: torch.Tensor) -> torch.Tensor:  # [T, K] float32
    """Rows `rows` [T] of the weight dequantized (an embedding's lookup)."""
    return dequantize(GGUFWeight(w.fmt, *(t.index_select(0, rows) for t in w.tensors().values())))


def random_blocks(name: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 [rows, row bytes]: valid GGUF blocks of random weights of about 0.05 in magnitude,
    for tests and benchmarks. The legacy types quantize random values with gguf-py; the K-quants
    (which gguf-py only dequantizes) are random bytes with small fp16 scales (any bytes are valid
    blocks, their packed 6-bit scales included)."""
    import gguf

    fmt = FORMATS[name]
    qtype = gguf.GGMLQuantizationType[name]
    if fmt.block == 32:
        values = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        return gguf.quantize(values, qtype)
    blocks = rng.integers(0, 256, size=(rows, cols // fmt.block, fmt.block_bytes), dtype=np.uint8)
    scale = {"Q4_K": 2e-4, "Q5_K": 1e-4, "Q6_K": 4e-5}[name]  # d: weights ~ d * 63 * 15 (Q6_K: / 32 * 127)

    def put(at: int, values: np.ndarray) -> None:
        blocks[..., at:at + 2] = values.astype(np.float16)[..., None].view(np.uint8)

    if name == "Q6_K":
        put(208, scale * (1 + rng.random(blocks.shape[:2])))
    else:
        put(0, scale * (1 + rng.random(blocks.shape[:2])))  # d
        put(2, scale * rng.random(blocks.shape[:2]))  # dmin
    return blocks.reshape(rows, -1)


def gguf_linear(x: torch.Tensor, w: GGUFWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ dequantize(w)^T (+ bias) in float32, returned in x's dtype."""
    out = x.float() @ dequantize(w).t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)
