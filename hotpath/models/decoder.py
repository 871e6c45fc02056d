"""The decoder-only transformer every supported family is built from: embedding, layers of
(RMSNorm, self-attention, RMSNorm, MLP block) with a residual stream, final RMSNorm, LM head.

A family (models/llama.py, models/qwen_moe.py, models/qwen3_next.py) subclasses `CausalLM`: it
parses its config.json (`config_from_hf`) and builds each layer's MLP block (`make_mlp`, dense or
sparse) and, where it is not self-attention, its token mixer (`make_mixer`: a hybrid model's
linear attention). Everything else, weight loading included, is shared here.

Decode steps of a few tokens take a fused chain (`DecoderModel.forward_few_rows`) where every block
fuses: each RMSNorm is applied as the next projection loads its input, from the sums of squares the
previous projection's epilogue (or the embedding lookup) gathered, so no norm kernel runs between
layers. A block whose layers cannot fuse (`fuses(x)` false) keeps the whole step on the plain path.

Under tensor parallelism (the model built inside `building_parallel`) every token mixer and MLP
block returns this rank's partial sum, unreduced; the decoder reduces it where it is added into
the residual stream, fused with that add and the next RMSNorm (`all_reduce_add_rms_norm`: the
post-attention norm, the next layer's input norm, the final norm), one all-reduce per block. The
few-rows chain adds each block's output into the residual in its epilogue, before any reduce
could run, so a tensor-parallel model always takes the plain path.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn as nn

from hotpath.config import ModelConfig
from hotpath.distributed.parallel_state import GroupCoordinator, current_parallel
from hotpath.layers.attention import SelfAttention
from hotpath.layers.embedding import LMHead, VocabEmbedding
from hotpath.layers.linear import WeightLoaders
from hotpath.layers.norm import RMSNorm
from hotpath.layers.rotary import RotaryEmbedding
from hotpath.layers.forward_batch import ForwardBatch


class DecoderLayer(nn.Module):
    """RMSNorm, the token mixer (self-attention, or a hybrid model's linear attention: under the
    checkpoint's name for it, `mixer_name`), RMSNorm, the MLP block."""

    def __init__(self, cfg: ModelConfig, mixer_name: str, mixer: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.zero_centred_norms)
        self.mixer_name = mixer_name
        setattr(self, mixer_name, mixer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.zero_centred_norms)
        self.mlp = mlp
        self.tp = reducing_group()

    @property
    def mixer(self) -> nn.Module:
        return getattr(self, self.mixer_name)

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous layer's MLP output (under tp, its partial sum) or, with residual
        None, the embedding; returns this layer's MLP output (partial under tp) and the residual."""
        if residual is None:
            residual = x
            x = self.input_layernorm(x)
        else:
            x, residual = add_norm(self.tp, self.input_layernorm, x, residual)
        x = self.mixer(positions, x, batch)
        x, residual = add_norm(self.tp, self.post_attention_layernorm, x, residual)
        return self.mlp(x), residual

    def fuses(self, x: torch.Tensor) -> bool:
        return self.mixer.fuses(x) and self.mlp.fuses(x)

    def forward_few_rows(
        self,
        positions: torch.Tensor,
        h: torch.Tensor,  # [M, hidden], the residual stream, updated in place
        sumsq: torch.Tensor,  # [T, M] fp32 h's partial sums of squares
        batch: ForwardBatch,
    ) -> torch.Tensor:  # [T', M] fp32, the new h's
        """`forward` for a step of a few tokens (decode) where both blocks fuse: for a dense
        layer, four projection launches and two of attention (QK-norm and RoPE included; the
        merge of its splits), rather than ten launches."""
        sumsq = self.mixer.forward_few_rows(positions, h, sumsq, self.input_layernorm, batch)
        return self.mlp.forward_few_rows(h, sumsq, self.post_attention_layernorm)


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int, family: CausalLM) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size)
        mm = cfg.multimodal
        rotary = RotaryEmbedding(cfg.head_dim, cfg.rope, max_positions, cfg.max_position_embeddings,
                                 None if mm is None else (mm.mrope_section, mm.max_step_tokens))
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, *family.make_mixer(cfg, rotary, i), family.make_mlp(cfg, i))
            for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.zero_centred_norms)
        self.tp = reducing_group()
        # one layer of each kind (mixer, MLP block, parameter shapes): what few_rows asks, so a
        # step's check costs one layer's, not every layer's (a plain list: not registered twice)
        kinds = {(type(layer.mixer), type(layer.mlp), tuple(p.shape for p in layer.parameters())): layer
                 for layer in self.layers}
        self._layer_kinds = list(kinds.values())

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:  # [num_tokens, hidden], after the final RMSNorm
        visual = batch.visual
        if visual is None and self.few_rows(input_ids.shape[0]):
            # the final norm a launch of its own: folded into the LM head's loads, every one of
            # its ~19k programs read the statistic and the norm weight (Qwen3-32B ~3% slower)
            return self.norm(self.forward_few_rows(input_ids, positions, batch))
        x = self.embed_tokens(input_ids)  # [num_tokens, hidden]
        if visual is not None:
            x.index_copy_(0, visual.rows, visual.embeds.to(x.dtype))
        residual = None
        for i, layer in enumerate(self.layers):
            x, residual = layer(positions, x, residual, batch)
            if visual is not None and i < len(visual.deepstack):
                # into the residual stream: the layer's output is residual + x
                residual.index_add_(0, visual.rows, visual.deepstack[i].to(residual.dtype))
        x, _ = add_norm(self.tp, self.norm, x, residual)
        return x

    def few_rows(self, num_tokens: int) -> bool:
        """Whether a forward of `num_tokens` tokens takes the fused chain (forward_few_rows):
        every layer's blocks fuse at that many rows (never under tp: see the module's note)."""
        if self.tp is not None:
            return False
        x = self.embed_tokens.stand_in(num_tokens)  # the step's input: its rows, dtype, device
        return all(layer.fuses(x) for layer in self._layer_kinds)

    def forward_few_rows(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:  # [M, hidden]
        """The layers of a step of a few tokens: the residual stream after the last layer, before
        the final RMSNorm. The embedding lookup stores the first layer's RMSNorm statistic, so no
        norm launch runs before its qkv projection."""
        h, sumsq = self.embed_tokens.with_sumsq(input_ids)
        for layer in self.layers:
            sumsq = layer.forward_few_rows(positions, h, sumsq, batch)
        return h


def reducing_group() -> GroupCoordinator | None:
    """The tp group a decoder built now reduces its blocks' partial sums over; None on one rank."""
    tp = current_parallel().tp
    return tp if tp.size > 1 else None


def add_norm(tp: GroupCoordinator | None, norm: RMSNorm, x: torch.Tensor, residual: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(residual + x), residual + x), x a block's output: on one rank the fused add +
    RMSNorm, under tp x is this rank's partial sum and is all-reduced first, in one call."""
    if tp is None:
        return norm(x, residual)
    return tp.all_reduce_add_rms_norm(x, residual, norm.weight, norm.eps)


class CheckpointLoading:
    """Loading from HF-named checkpoint tensors, for a module whose layers name their tensors
    (`checkpoint_tensors`; any other parameter is its own): `CausalLM`, and the MTP head a
    hybrid checkpoint carries beside its model (models/mtp.py). Needs `self.config`."""

    config: ModelConfig

    def checkpoint_name(self, name: str) -> str | None:
        """The model's name for a checkpoint tensor, or None for one it does not use (a family
        whose checkpoints nest the text model, or carry other towers, maps them here)."""
        return name

    def weight_loaders(self) -> WeightLoaders:
        """{checkpoint (HF) tensor name: loader}: layers that fill fused or stacked parameters
        name their checkpoint tensors (checkpoint_tensors); any other parameter is its own."""
        loaders: WeightLoaders = {}
        for prefix, module in self.named_modules():
            if prefix == "lm_head" and self.config.tie_word_embeddings:
                continue  # the embedding's matrix
            if hasattr(module, "checkpoint_tensors"):
                loaders.update(module.checkpoint_tensors(prefix))
                continue
            for name, param in module.named_parameters(prefix=prefix, recurse=False):
                loaders[name] = _copy_into(param)
        return loaders

    def optional_weight_loaders(self) -> WeightLoaders:
        """{checkpoint (HF) tensor name: loader} for tensors a checkpoint may leave out (the
        attention layers' fp8 KV-cache scales): layers name them (optional_checkpoint_tensors)."""
        loaders: WeightLoaders = {}
        for prefix, module in self.named_modules():
            if hasattr(module, "optional_checkpoint_tensors"):
                loaders.update(module.optional_checkpoint_tensors(prefix))
        return loaders

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint tensors (HF names) into the parameters, one at a time."""
        loaders = self.weight_loaders()
        optional = self.optional_weight_loaders()
        loaded: set[str] = set()
        for name, tensor in weights:
            name = self.checkpoint_name(name)
            if name is None or "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue  # some tied checkpoints store the shared matrix twice
            loader = loaders.get(name) or optional.get(name)
            if loader is None:
                raise ValueError(f"checkpoint tensor {name!r} does not belong to this model")
            try:
                loader(tensor)
            except ValueError as e:
                raise ValueError(f"checkpoint tensor {name!r} {e}") from None
            loaded.add(name)
        missing = [n for n in loaders if n not in loaded]
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise ValueError(f"checkpoint is missing {len(missing)} weights: {shown}")

    def expected_weight_names(self) -> list[str]:
        """The checkpoint (HF) tensor names this model needs."""
        return list(self.weight_loaders())


class CausalLM(CheckpointLoading, nn.Module):
    """A decoder with its LM head; the model contract the runner relies on:
    forward(input_ids, positions, batch) -> hidden, compute_logits(hidden) -> fp32 logits, the
    layers that keep a cache (`cache_layers`), and `load_weights` from HF-named tensors."""

    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = cfg
        self.model = DecoderModel(cfg, max_positions, self)
        self.lm_head = LMHead(cfg.vocab_size, cfg.hidden_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    # ---- what a family provides ---------------------------------------------------------------
    @classmethod
    def config_from_hf(cls, arch: str, hf: dict[str, Any]) -> ModelConfig:
        """This family's ModelConfig from a config.json's contents."""
        raise NotImplementedError

    def make_mlp(self, cfg: ModelConfig, layer: int) -> nn.Module:
        """Layer `layer`'s MLP block."""
        raise NotImplementedError

    def make_mixer(self, cfg: ModelConfig, rotary: RotaryEmbedding, layer: int) -> tuple[str, nn.Module]:
        """Layer `layer`'s token mixer and its checkpoint name: self-attention unless a family
        says otherwise."""
        return "self_attn", SelfAttention(
            cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, rotary,
            qkv_bias=cfg.attention_bias, qk_norm_eps=cfg.rms_norm_eps if cfg.qk_norm else None,
            output_gate=cfg.attn_output_gate, zero_centred_norms=cfg.zero_centred_norms,
        )

    # ---- the runner's contract ----------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens]
        positions: torch.Tensor,  # [num_tokens]
        batch: ForwardBatch,
    ) -> torch.Tensor:  # [num_tokens, hidden]
        return self.model(input_ids, positions, batch)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [rows, vocab] fp32
        return self.lm_head(hidden)

    def cache_layers(self) -> list[nn.Module]:
        """The layers that keep a per-sequence cache, in order (each has cache_spec/bind_cache)."""
        return [m for m in self.modules() if hasattr(m, "cache_spec")]


def rotary_table(model: nn.Module) -> RotaryEmbedding | None:
    """The model's RoPE table (its self-attention layers share one), or None if it has none."""
    return next((m for m in model.modules() if isinstance(m, RotaryEmbedding)), None)


def _copy_into(param: nn.Parameter):
    def load(tensor: torch.Tensor) -> None:
        if param.shape != tensor.shape:
            raise ValueError(f"has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}")
        param.data.copy_(tensor)

    return load
