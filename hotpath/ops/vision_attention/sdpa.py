"""The vision towers' attention through torch's cuDNN attention on NVIDIA GPUs: each run of
neighbouring segments of one length (an image, a video's frames) as one batched call. It measured
faster than the Triton kernel at head_dim 72 (docs/decisions.md, "Vision"); the Triton kernel
stays the path on AMD, for other head dims, for runs cuDNN does not take (torch says which) and for
a forced `HOTPATH_OPS=triton`."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.backends.cuda import SDPAParams
from torch.nn.attention import SDPBackend, sdpa_kernel


def supported(q: torch.Tensor) -> bool:
    """cuDNN's fused attention: an NVIDIA GPU, 16-bit inputs, head_dim a multiple of 8 up to 128."""
    return (q.is_cuda and torch.version.hip is None and q.dtype in (torch.bfloat16, torch.float16)
            and q.shape[-1] % 8 == 0 and q.shape[-1] <= 128 and torch.backends.cudnn.is_available())


def varlen_attention(
    q: torch.Tensor,  # [total_tokens, num_heads, head_dim] (any token stride)
    k: torch.Tensor,
    v: torch.Tensor,
    segment_lengths: list[int],  # tokens of each segment, in order; they cover the tokens
    scale: float,
    fallback: Callable[..., torch.Tensor],  # (q, k, v, segment_lengths, scale) of a run cuDNN does not take
) -> torch.Tensor:  # [total_tokens, num_heads, head_dim], contiguous
    total_tokens, num_heads, head_dim = q.shape
    pieces = []  # each run's output, [its tokens, heads, dim]
    start = 0
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for length, run in itertools.groupby(segment_lengths):
            count = len(list(run))
            end = start + count * length
            if length:
                # [count, heads, length, dim] views of the run's tokens
                qs, ks, vs = (x[start:end].unflatten(0, (count, length)).transpose(1, 2) for x in (q, k, v))
                if torch.backends.cuda.can_use_cudnn_attention(SDPAParams(qs, ks, vs, None, 0.0, False, False)):
                    o = F.scaled_dot_product_attention(qs, ks, vs, scale=scale)
                    pieces.append(o.transpose(1, 2).reshape(end - start, num_heads, head_dim))
                else:
                    pieces.append(fallback(q[start:end], k[start:end], v[start:end], [length] * count, scale))
            start = end
    if len(pieces) == 1:  # one image or one video's frames: cuDNN's output as it is, no copy
        return pieces[0].contiguous()
    return torch.cat(pieces) if pieces else q.new_empty(q.shape)
