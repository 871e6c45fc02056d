"""AWQ (activation-aware weight quantization): before rounding to int4, each input channel of a
linear is scaled up by s (and its input scaled down by s, folded into the RMSNorm or linear that
produces it, so the fp model is unchanged), with s = x_mean^a / w_mean^(1-a) chosen per group of
linears sharing an input by a grid search over a that minimizes the error of the quantized outputs
on calibration activations: channels that see large activations keep more precision. Then each
linear's clipping range is searched per group of inputs (shrinking the max up to half), and the
result rounded to nearest (int4_rtn.py).

The scaled pairs, per decoder layer: input_layernorm -> q/k/v, v_proj -> o_proj (where v's
outputs are o's inputs one to one: equal head counts), post_attention_layernorm -> gate/up,
up_proj -> down_proj."""

from __future__ import annotations

import torch
import torch.nn as nn

from hotpath.quantizer.int4_rtn import fake_quantize, quantize_rtn

N_GRID = 20
MAX_SHRINK = 0.5  # the clip search tries max * (1 - i / N_GRID) down to this fraction
CLIP_TOKENS = 512  # calibration rows the clip search uses
LOSS_TOKENS = 4096  # calibration rows the scale search measures its error on

SCALED_PAIRS = (
    ("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    ("self_attn.v_proj", ("self_attn.o_proj",)),
    ("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj")),
    ("mlp.up_proj", ("mlp.down_proj",)),
)
NO_CLIP = ("self_attn.q_proj", "self_attn.k_proj")  # attention scores are too sensitive to clip


class InputStats:
    """A linear's calibration inputs: the mean magnitude per channel over every token, and a
    random sample of rows for measuring errors."""

    def __init__(self, max_rows: int, seed: int = 0) -> None:
        self.abs_sum: torch.Tensor | None = None
        self.count = 0
        self.rows: list[torch.Tensor] = []
        self.max_rows = max_rows
        self.gen = torch.Generator().manual_seed(seed)

    def add(self, x: torch.Tensor) -> None:  # [T, K]
        x = x.float()
        s = x.abs().sum(0)
        self.abs_sum = s if self.abs_sum is None else self.abs_sum + s
        self.count += x.shape[0]
        keep = torch.randperm(x.shape[0], generator=self.gen)[: self.max_rows]
        self.rows.append(x[keep.to(x.device)])

    def mean(self) -> torch.Tensor:  # [K]
        return self.abs_sum / self.count

    def sample(self, n: int) -> torch.Tensor:  # [<= n, K]
        rows = torch.cat(self.rows)
        return rows[torch.randperm(rows.shape[0], generator=self.gen)[:n].to(rows.device)]


@torch.no_grad()
def search_scale(x_mean: torch.Tensor, x: torch.Tensor, linears: list[nn.Linear], group_size: int
                 ) -> torch.Tensor:
    """The input-channel scale s [K] minimizing |x W^T - (x / s) Q(W s)^T|^2 over the grid
    (s = 1, plain round to nearest, included)."""
    w = torch.cat([lin.weight.float() for lin in linears])  # [sum N, K]
    N, K = w.shape
    reference = x @ w.T
    groups = w.abs().reshape(N, K // group_size, group_size)
    w_mean = (groups / groups.amax(-1, keepdim=True).clamp(min=1e-8)).reshape(N, K).mean(0)
    best_s = torch.ones_like(x_mean)
    best = ((x @ fake_quantize(w, group_size).T - reference) ** 2).mean()
    for i in range(N_GRID):
        ratio = i / N_GRID
        s = (x_mean.pow(ratio) / (w_mean.pow(1 - ratio) + 1e-4)).clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        loss = ((x @ (fake_quantize(w * s, group_size) / s).T - reference) ** 2).mean()
        if loss < best:
            best, best_s = loss, s
    return best_s


@torch.no_grad()
def apply_scale(prev: nn.Module, linears: list[nn.Linear], s: torch.Tensor) -> None:
    """prev's outputs / s, the linears' input channels * s: the fp function is unchanged."""
    if isinstance(prev, nn.Linear):
        prev.weight.div_(s[:, None].to(prev.weight.dtype))
        if prev.bias is not None:
            prev.bias.div_(s.to(prev.bias.dtype))
    else:  # an RMSNorm: y = w * normalize(x)
        prev.weight.div_(s.to(prev.weight.dtype))
    for lin in linears:
        lin.weight.mul_(s[None, :].to(lin.weight.dtype))


@torch.no_grad()
def search_clip(w: torch.Tensor, x: torch.Tensor, group_size: int, rows_at_once: int = 1024
                ) -> torch.Tensor:
    """Per (output row, input group), the max |w| that minimizes the group's quantized output
    error on x; returns w clamped to it."""
    N, K = w.shape
    G = K // group_size
    # each group's partial outputs as one batched matmul over the groups (a broadcast product
    # of [rows, T, G, group_size] is far slower)
    xg = x.float().reshape(x.shape[0], G, group_size).transpose(0, 1)  # [G, T, group_size]
    clipped = torch.empty_like(w, dtype=torch.float32)
    for start in range(0, N, rows_at_once):
        wg = w[start:start + rows_at_once].float().reshape(-1, G, group_size)  # [rows, G, group_size]
        reference = torch.bmm(xg, wg.permute(1, 2, 0))  # [G, T, rows]
        org_max = wg.abs().amax(-1, keepdim=True)  # [rows, G, 1]
        best_err = torch.full(org_max.shape, float("inf"), device=w.device)
        best_max = org_max.clone()
        for i in range(int(MAX_SHRINK * N_GRID)):
            max_val = org_max * (1 - i / N_GRID)
            q = fake_quantize(wg.clamp(-max_val, max_val).reshape(-1, group_size), group_size)
            out = torch.bmm(xg, q.reshape(wg.shape).permute(1, 2, 0))  # [G, T, rows]
            err = (out - reference).pow(2).mean(1).T[..., None]  # [rows, G, 1]
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_max = torch.where(better, max_val, best_max)
        clipped[start:start + rows_at_once] = wg.clamp(-best_max, best_max).reshape(-1, K)
    return clipped


@torch.no_grad()
def quantize_layer_awq(layer: nn.Module, stats: dict[str, InputStats], group_size: int,
                       clip: bool = True, scale_search: bool = True
                       ) -> dict[str, tuple[torch.Tensor, ...]]:
    """Scales, clips and rounds one decoder layer's linears in place (each left holding its
    dequantized weight); returns {linear name: (q [N, K], zeros, scales [N, K/G])}. Without
    the scale search and the clip search this is plain round to nearest."""
    input_scale: dict[str, torch.Tensor] = {}
    for prev_name, names in SCALED_PAIRS if scale_search else ():
        prev = layer.get_submodule(prev_name)
        linears = [layer.get_submodule(n) for n in names]
        if isinstance(prev, nn.Linear) and prev.out_features != linears[0].in_features:
            continue  # grouped-query attention: v's outputs repeat across heads, no 1:1 channels
        st = stats[names[0]]
        s = search_scale(st.mean(), st.sample(LOSS_TOKENS), linears, group_size)
        apply_scale(prev, linears, s)
        for n in names:
            input_scale[n] = s
    quantized = {}
    for _, names in SCALED_PAIRS:
        x = stats[names[0]].sample(CLIP_TOKENS)
        for name in names:
            lin = layer.get_submodule(name)
            w = lin.weight.float()
            if clip and name not in NO_CLIP:
                w = search_clip(w, x / input_scale.get(name, 1.0), group_size)
            q, zeros, scales, deq = quantize_rtn(w, group_size)
            lin.weight.copy_(deq.to(lin.weight.dtype))
            quantized[name] = (q, zeros, scales)
    return quantized
