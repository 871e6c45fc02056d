"""The Gated DeltaNet layer of Qwen3-Next and Qwen3.5: linear attention with a per-sequence state
slot.

    q k v z b a = projections of x                         (see `layout` below)
    q, k, v   = silu(causal_conv1d([q k v]))               depthwise, kernel 4, rolling state
    g, beta   = -exp(A_log) * softplus(a + dt_bias), sigmoid(b)
    o         = gated_delta_rule(q, k, v, g, beta)         from the sequence's recurrent state
    out       = out_proj(rmsnorm(o) * silu(z))             the norm per value head

The two checkpoint layouts: Qwen3-Next's `in_proj_qkvz` and `in_proj_ba`, grouped by key head
(per key head its q, k, then the v and z of the value heads it serves; b and a likewise), and
Qwen3.5's `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`, each flat, loaded here into one
projection (one matmul for the four).

Each sequence's conv and recurrent states live in its slot of the layer's state pool (declared by
`cache_spec`, bound by the runner; `ForwardBatch.state_slots` names a step's slots). A sequence
whose step starts at position 0 starts from zero states; otherwise it continues from its slot, so
chunked prefill and decoding resume where the last step left off. On the GPU, prefill runs the
conv and the delta rule each as one varlen kernel chain for all sequences (ops/gated_delta's
triton_conv.py and triton_chunked.py, sharing one chunk table); decode steps (one token per sequence) run the decode
step's kernels: two launches for all sequences, and no host reads, so the runner's decode CUDA
graphs hold them (the slots come from the graphs' static inputs; around a graph's replay the
runner restores and saves state snapshots itself, with `restore` and `save`).

Speculative decoding: a verify row (a sequence's last token and its drafts, `ForwardBatch.
verify_rows`) advances the slot by all its tokens, but after acceptance the sequence keeps only
the first `kept` of them. The forward keeps, for the verify rows only, their slots' states from
before the step and the step's per-token inputs (the conv's inputs, q k v after the conv, g,
beta: a few small tensors, no per-position states); `rollback` then recomputes each slot's
states after its first `kept` tokens: the conv window from the saved window and the inputs, the
delta rule over the kept tokens from the saved state (the same op as the step's, varlen). A
draft model's own speculative tokens run on a copy of its slot instead (`copy_states`, see
ModelRunner._draft_state_slots).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn as nn

from hotpath.distributed.parallel_state import current_parallel
from hotpath.layers.cache import StateCacheSpec
from hotpath.layers.linear import Linear, WeightLoaders
from hotpath.layers.quant.base import copy_checked
from hotpath.ops.gated_delta import (
    causal_conv1d_varlen,
    decode_step,
    gated_delta_rule,
    prefill_chunks,
    reference,
)
from hotpath.ops.norm import gated_rms_norm
from hotpath.layers.forward_batch import ForwardBatch


@dataclass
class VerifyRecord:
    """What a forward with verify rows keeps for `GatedDeltaNet.rollback`: per verify row (in the
    order of `ForwardBatch.verify_rows`) its slot and states before the step, and its tokens'
    inputs back to back (row j's are rows cu[j]:cu[j + 1])."""

    slots: list[int]  # each verify row's state slot
    cu: list[int]  # [V + 1] offsets of the rows' tokens in the tensors below
    conv: torch.Tensor  # [V, conv_dim, K - 1] conv states before the step
    state: torch.Tensor  # [V, Hv, Dk, Dv] fp32 recurrent states before the step
    mixed: torch.Tensor  # [Tv, conv_dim] the conv's inputs
    y: torch.Tensor | None = None  # [Tv, conv_dim] silu(conv) = [q | k | v]
    g: torch.Tensor | None = None  # [Tv, Hv]
    beta: torch.Tensor | None = None  # [Tv, Hv]


class GatedRMSNorm(nn.Module):
    """rmsnorm(x) * weight * silu(gate), per value head (the weight is not zero-centred)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:  # [T, H, D] -> [T, H * D]
        return gated_rms_norm(x, gate, self.weight, self.eps)


class GatedDeltaNet(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_k_heads: int,
        num_v_heads: int,
        k_head_dim: int,
        v_head_dim: int,
        conv_width: int,
        eps: float,
        layout: str = "qwen3_next",  # or "qwen3_5"
    ) -> None:
        super().__init__()
        if layout not in ("qwen3_next", "qwen3_5"):
            raise ValueError(f"unknown Gated DeltaNet checkpoint layout {layout!r}")
        if num_v_heads % num_k_heads:
            raise ValueError(f"{num_v_heads} value heads do not share {num_k_heads} key heads evenly")
        tp = current_parallel().tp
        if num_k_heads % tp.size:
            raise ValueError(f"tensor parallelism over {tp.size} ranks must divide the Gated DeltaNet's "
                             f"{num_k_heads} key heads (each rank holds whole key heads and the value "
                             f"heads they serve)")
        # this rank's heads (all of them at tp = 1): key heads k0.., value heads v0..
        nk, nv = num_k_heads // tp.size, num_v_heads // tp.size
        k0, v0 = tp.rank * nk, tp.rank * nv
        self.num_k_heads, self.num_v_heads = nk, nv
        self.k_head_dim, self.v_head_dim = k_head_dim, v_head_dim
        self.key_dim, self.value_dim = nk * k_head_dim, nv * v_head_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.conv_width = conv_width
        self.layout = layout
        full_key, full_value = num_k_heads * k_head_dim, num_v_heads * v_head_dim
        split = tp.size > 1
        if layout == "qwen3_next":
            # grouped by key head, so a rank's key heads are one run of each tensor
            group = 2 * k_head_dim + 2 * (num_v_heads // num_k_heads) * v_head_dim
            ba_group = 2 * (num_v_heads // num_k_heads)
            self.in_proj_qkvz = Linear(hidden_size, [num_k_heads * group], parallel="column",
                                       shard_ranges=[(k0 * group, nk * group)] if split else None)
            self.in_proj_ba = Linear(hidden_size, [num_k_heads * ba_group], parallel="column",
                                     shard_ranges=[(k0 * ba_group, nk * ba_group)] if split else None)
        else:
            # in_proj_qkv is [q (every key head) | k | v]: three stacked parts, a rank's run of each
            self.in_proj = JointLinear(
                hidden_size, [full_key, full_key, full_value, full_value, num_v_heads, num_v_heads],
                checkpoint_names=["in_proj_qkv"] * 3 + ["in_proj_z", "in_proj_b", "in_proj_a"],
                shard_ranges=[(k0 * k_head_dim, self.key_dim)] * 2 + [(v0 * v_head_dim, self.value_dim)] * 2
                + [(v0, nv)] * 2 if split else None)
        # the conv's channels are [q | k | v] of every head: the rank's run of each
        channels = torch.cat([torch.arange(k0 * k_head_dim, (k0 + nk) * k_head_dim) + offset
                              for offset in (0, full_key)]
                             + [torch.arange(v0 * v_head_dim, (v0 + nv) * v_head_dim) + 2 * full_key])
        self.conv1d = RankRows(torch.empty(self.conv_dim, 1, conv_width), channels if split else None)
        self.dt_bias = nn.Parameter(torch.empty(nv), requires_grad=False)  # [Hv] the rank's heads'
        self.A_log = nn.Parameter(torch.empty(nv), requires_grad=False)
        self.value_heads = torch.arange(v0, v0 + nv) if split else None
        self.norm = GatedRMSNorm(v_head_dim, eps)  # per head: the same weight on every rank
        self.out_proj = Linear(full_value, [hidden_size], parallel="row")  # tp > 1: a partial sum
        # (conv states [slots, conv_dim, conv_width - 1], recurrent states [slots, Hv, Dk, Dv] fp32),
        # and the same for the snapshots prefix caching keeps
        self.state: tuple[torch.Tensor, torch.Tensor] | None = None
        self.snapshots: tuple[torch.Tensor, torch.Tensor] | None = None
        # the last forward's verify rows, kept until the runner rolls them back (speculation)
        self.verify: VerifyRecord | None = None

    def checkpoint_tensors(self, prefix: str) -> WeightLoaders:
        """Its own parameters (the layers inside name theirs): the rank's value heads' gates."""
        return {f"{prefix}.{name}": partial(load_rows, getattr(self, name).data, self.value_heads)
                for name in ("dt_bias", "A_log")}

    def load_unsharded(self, param_name: str, full: torch.Tensor) -> None:
        """Its own parameters from the one-rank layer's (dummy weights, loader/dummy.py)."""
        load_rows(getattr(self, param_name).data, self.value_heads, full)

    def cache_spec(self) -> StateCacheSpec:
        """This rank's heads' states (the runner allocates each rank its share)."""
        return StateCacheSpec(self.conv_dim, self.conv_width, self.num_v_heads, self.k_head_dim,
                              self.v_head_dim)

    def bind_cache(self, cache: tuple[torch.Tensor, torch.Tensor],
                   snapshots: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.state, self.snapshots = cache, snapshots

    def restore(self, snapshot_ids: torch.Tensor, slots: torch.Tensor) -> None:
        """Each slot's states := its snapshot's (a prefix hit resumes there)."""
        for pool, saved in zip(self.state, self.snapshots):
            pool[slots] = saved[snapshot_ids]

    def save(self, slots: torch.Tensor, snapshot_ids: torch.Tensor) -> None:
        """Each snapshot's states := its slot's (a block boundary)."""
        for pool, saved in zip(self.state, self.snapshots):
            saved[snapshot_ids] = pool[slots]

    def copy_states(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Slots dst := slots src (a draft model's speculative tokens run on a copy)."""
        for pool in self.state:
            pool[dst] = pool[src]

    def rollback(self, rows: list[int], kept: list[int]) -> None:
        """After acceptance: verify row rows[i] of the last forward (an index into its
        `verify_rows`) keeps only its first kept[i] tokens (1 <= kept[i] <= its tokens). Its slot's
        states := the states after those tokens, recomputed from the states before the step and
        the recorded inputs. No host sync: index tensors built on the host, then device ops."""
        rec = self.verify
        assert rec is not None, "no verify rows recorded in the last forward"
        if not rows:
            return
        conv_states, states = self.state
        device = states.device
        width = self.conv_width - 1
        num_verify = len(rec.slots)

        def dev(data: list[int]) -> torch.Tensor:
            return torch.tensor(data, dtype=torch.int64).to(device, non_blocking=True)

        slots = dev([rec.slots[j] for j in rows])
        # the conv window after kept tokens: positions kept .. kept + K - 2 of the row's inputs
        # [saved window (K - 1), its tokens' inputs], as rows of `src`
        src = torch.cat([rec.conv.transpose(1, 2).reshape(num_verify * width, -1),
                         rec.mixed.to(conv_states.dtype)])
        window = dev([[j * width + p if p < width else num_verify * width + rec.cu[j] + p - width
                       for p in range(n, n + width)] for j, n in zip(rows, kept)])
        conv_states[slots] = src[window].transpose(1, 2)
        # the rule over the kept tokens from the states before the step
        states[slots] = rec.state[dev(rows)]
        tokens = dev([rec.cu[j] + t for j, n in zip(rows, kept) for t in range(n)])
        cu = [0]
        for n in kept:
            cu.append(cu[-1] + n)
        y = rec.y[tokens]
        q, k, v = y.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        gated_delta_rule(q.reshape(-1, self.num_k_heads, self.k_head_dim),
                         k.reshape(-1, self.num_k_heads, self.k_head_dim),
                         v.reshape(-1, self.num_v_heads, self.v_head_dim), rec.g[tokens], rec.beta[tokens],
                         torch.tensor(cu, dtype=torch.int32).to(device, non_blocking=True), states, slots)

    def fuses(self, x: torch.Tensor) -> bool:
        # under tp > 1 out_proj is row-parallel and does not fuse (its sum must be reduced first)
        return all(proj.fuses(x) for proj in self._projections()) and self.out_proj.fuses(x)

    def _projections(self) -> list[Linear]:
        return [self.in_proj] if self.layout == "qwen3_5" else [self.in_proj_qkvz, self.in_proj_ba]

    def forward(self, positions: torch.Tensor, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """[T, hidden] -> [T, hidden]; under tp > 1 this rank's partial sum (the decoder reduces)."""
        return self.out_proj(self._mix(*self._project(x), batch))

    def forward_few_rows(
        self,
        positions: torch.Tensor,
        h: torch.Tensor,  # [M, hidden], the residual stream, updated in place
        sumsq: torch.Tensor,  # [T, M] fp32, h's partial sums of squares
        norm: nn.Module,  # the input RMSNorm, applied as the projections load h
        batch: ForwardBatch,
    ) -> torch.Tensor:  # [T', M] fp32, the new h's
        """h += out_proj(mix(in_proj(norm(h)))): the projections' launches (the norm in their
        loads, the residual add in out_proj's epilogue), the conv, the rule and the gated norm."""
        mixed = self._mix(*self._project(h, (sumsq, norm.weight, norm.eps)), batch)
        return self.out_proj.add_residual(mixed, h)

    def _project(self, x: torch.Tensor, rms=None):
        """-> the conv's input [T, conv_dim] = [q | k | v] (a view of the projection in Qwen3.5's
        layout), z [T, Hv, Dv], b, a [T, Hv]."""
        T = x.shape[0]
        if self.layout == "qwen3_5":
            proj = self.in_proj(x, rms=rms)
            mixed, z, b, a = proj.split([self.conv_dim, self.value_dim, self.num_v_heads, self.num_v_heads],
                                        dim=-1)
            return mixed, z.view(T, self.num_v_heads, self.v_head_dim), b, a
        qkvz, ba = self.in_proj_qkvz(x, rms=rms), self.in_proj_ba(x, rms=rms)
        hk = self.num_k_heads
        per = self.num_v_heads // hk
        # grouped by key head: its q, k, then the v and z of its value heads (b and a likewise)
        q, k, v, z = qkvz.view(T, hk, -1).split(
            [self.k_head_dim, self.k_head_dim, per * self.v_head_dim, per * self.v_head_dim], dim=-1)
        b, a = ba.view(T, hk, 2 * per).split([per, per], dim=-1)
        mixed = torch.cat([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], dim=-1)
        return (mixed, z.reshape(T, self.num_v_heads, self.v_head_dim), b.reshape(T, -1), a.reshape(T, -1))

    def _mix(self, mixed: torch.Tensor, z: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
             batch: ForwardBatch) -> torch.Tensor:  # [T, value_dim], out_proj's input
        """The conv, the delta rule from each sequence's slot, the gated norm."""
        assert self.state is not None and batch.state_slots is not None, "no state slots bound"
        conv_states, states = self.state
        weight = self.conv1d.weight[:, 0, :]  # [conv_dim, conv_width]
        saves = {row: (cut, snap) for row, cut, snap in batch.state_saves or ()}
        self.verify = None  # a new step (verify rows have 2 tokens or more: the prefill path)
        if batch.max_query_len == 1:  # decode: every sequence one token, all at once (the
            # runner saves snapshots after the step)
            assert not saves
            out = decode_step(mixed, weight, conv_states, a, b, self.A_log, self.dt_bias, states,
                              batch.state_slots, batch.context_lens, self.num_k_heads)
        else:
            g, beta = reference.gates(a, b, self.A_log, self.dt_bias)
            out = self._prefill(mixed, weight, g, beta, batch, saves)
        return self.norm(out, z)

    def _prefill(self, mixed: torch.Tensor, weight: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 batch: ForwardBatch, saves: dict[int, tuple[int, int]]) -> torch.Tensor:  # [T, Hv, Dv]
        """Each sequence's tokens from its slot's states, the states after them written back; where
        the step saves a snapshot `cut` tokens into a sequence's chunk, the rule runs in two
        rounds (every sequence up to its cut, the snapshots, then the rest)."""
        conv_states, states = self.state
        cu = batch.cu_query_lens.tolist()
        slots = batch.state_slots.tolist()
        starts = [c - (cu[i + 1] - cu[i]) for i, c in enumerate(batch.context_lens.tolist())]
        fresh = [slot for slot, start in zip(slots, starts) if start == 0]
        if fresh:  # a sequence's first step: nothing before it
            fresh_slots = torch.tensor(fresh, device=mixed.device)
            conv_states[fresh_slots] = 0
            states[fresh_slots] = 0
        rec = None
        if batch.verify_rows:  # speculation: what `rollback` needs, the states before the step first
            verify_slots = [slots[i] for i in batch.verify_rows]
            index = torch.tensor(verify_slots, dtype=torch.int64).to(mixed.device, non_blocking=True)
            cu_verify = [0]
            for i in batch.verify_rows:
                cu_verify.append(cu_verify[-1] + cu[i + 1] - cu[i])
            rec = VerifyRecord(verify_slots, cu_verify, conv_states[index], states[index],
                               mixed[batch.verify_tokens])
        # a snapshot's conv state at a cut: the last inputs before it (read before the conv moves
        # the slot's state on)
        conv_at_cut = {}
        for i, (cut, _) in saves.items():
            inputs = torch.cat([conv_states[slots[i]], mixed[cu[i] : cu[i] + cut].T.to(conv_states.dtype)], 1)
            conv_at_cut[i] = inputs[:, inputs.shape[1] - (self.conv_width - 1):]
        chunks = prefill_chunks(batch.cu_query_lens, mixed.shape[0])
        y = causal_conv1d_varlen(mixed, weight, conv_states, batch.cu_query_lens, batch.state_slots, chunks)
        if rec is not None:
            rec.y, rec.g, rec.beta = y[batch.verify_tokens], g[batch.verify_tokens], beta[batch.verify_tokens]
            self.verify = rec
        q, k, v = y.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(-1, self.num_k_heads, self.k_head_dim)
        k = k.reshape(-1, self.num_k_heads, self.k_head_dim)
        v = v.reshape(-1, self.num_v_heads, self.v_head_dim)
        if not saves:  # the step's own device tensors: nothing to copy per layer
            return gated_delta_rule(q, k, v, g, beta, batch.cu_query_lens, states, batch.state_slots, chunks)
        cuts = [saves[i][0] if i in saves else cu[i + 1] - cu[i] for i in range(len(slots))]
        out = torch.empty_like(v)
        rule = (q, k, v, g, beta, states, batch.state_slots, out)
        _rule_over([range(cu[i], cu[i] + cut) for i, cut in enumerate(cuts)], *rule)
        snapshot_convs, snapshot_states = self.snapshots
        for i, conv in conv_at_cut.items():  # the states at the cuts
            snapshot_convs[saves[i][1]] = conv
            snapshot_states[saves[i][1]] = states[slots[i]]
        _rule_over([range(cu[i] + cut, cu[i + 1]) for i, cut in enumerate(cuts)], *rule)
        return out


class RankRows(nn.Module):
    """`weight`: this rank's rows of its checkpoint tensor (the conv's channels), `rows` [n]
    their indices in it (None: all of it)."""

    def __init__(self, data: torch.Tensor, rows: torch.Tensor | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(data, requires_grad=False)
        self.rows = rows

    def checkpoint_tensors(self, prefix: str) -> WeightLoaders:
        return {f"{prefix}.weight": partial(load_rows, self.weight.data, self.rows)}

    def load_unsharded(self, param_name: str, full: torch.Tensor) -> None:
        load_rows(self.weight.data, self.rows, full)


def load_rows(target: torch.Tensor, rows: torch.Tensor | None, loaded: torch.Tensor) -> None:
    """target := loaded's rows `rows` (all of them for None)."""
    if rows is not None:
        loaded = loaded.index_select(0, rows.to(loaded.device))
    copy_checked(target, loaded)


class JointLinear(Linear):
    """A column-parallel Linear some of whose stacked projections are one checkpoint tensor
    (repeated names in `checkpoint_names`, consecutive): Qwen3.5's in_proj_qkv, whose q, k and v
    parts each split over the ranks (a rank's q heads, its k heads, its v heads). The tensor is
    cut into its parts (whole along the output axis) and each loads as its own projection."""

    def __init__(self, in_features: int, output_sizes: list[int], checkpoint_names: list[str],
                 shard_ranges: list[tuple[int, int]] | None) -> None:
        super().__init__(in_features, output_sizes, checkpoint_names=checkpoint_names, parallel="column",
                         shard_ranges=shard_ranges)

    def checkpoint_tensors(self, prefix: str) -> WeightLoaders:
        parent = prefix.rpartition(".")[0]
        loaders: WeightLoaders = {}
        for param_name, param in self.named_parameters(recurse=False):
            if not getattr(param, "from_checkpoint", True):
                continue
            for ckpt in dict.fromkeys(self.checkpoint_names):
                shards = [i for i, name in enumerate(self.checkpoint_names) if name == ckpt]
                loaders[f"{parent}.{ckpt}.{param_name}"] = partial(self._load_parts, param, shards)
        return loaders

    def _load_parts(self, param: nn.Parameter, shards: list[int], loaded: torch.Tensor) -> None:
        output_dim = getattr(param, "output_dim", 0)
        if len(shards) == 1 or output_dim is None:
            for shard in shards:
                self.weight_loader(param, shard, loaded)
            return
        pack = getattr(param, "checkpoint_pack", getattr(param, "pack_factor", 1))
        start = 0
        for shard in shards:
            size = self.full_output_sizes[shard]
            if start % pack or size % pack:
                raise ValueError(f"parts {[self.full_output_sizes[i] for i in shards]} do not fall on "
                                 f"whole elements of {pack} output features")
            self.weight_loader(param, shard, loaded.narrow(output_dim, start // pack, size // pack))
            start += size


def _rule_over(ranges: list[range], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
               beta: torch.Tensor, states: torch.Tensor, slots: torch.Tensor, out: torch.Tensor) -> None:
    """The delta rule over sequence i's tokens `ranges[i]` (maybe none) from and into slots[i],
    the outputs written to those rows of `out`."""
    rows = torch.tensor([r for rng in ranges for r in rng], dtype=torch.long, device=v.device)
    if rows.numel():
        cu = torch.tensor([0] + [len(rng) for rng in ranges], device=v.device).cumsum(0).to(torch.int32)
        out[rows] = gated_delta_rule(q[rows], k[rows], v[rows], g[rows], beta[rows], cu, states, slots)
