"""The multi-token-prediction (MTP) head of Qwen3-Next and Qwen3.5 checkpoints, which speculative
decoding with method "mtp" drafts with (`MtpHead`; `hotpath.loader.model_loader.load_mtp` builds
and loads it beside its target).

Structure, per draft row t (one MTP layer; a checkpoint with several applies layer k % n at
draft step k):

    e = pre_fc_norm_embedding(embed_tokens(token))        the target's embedding
    h = pre_fc_norm_hidden(hidden)                        a hidden state of width H
    x = fc(cat([e, h]))                                   [2H] -> [H], no bias
    x = layers[k](x)                                      one full-attention decoder layer
    out = norm(x)                                         -> compute_logits: the target's LM head

Facts, and the file each comes from (vLLM: vllm/model_executor/models/qwen3_next_mtp.py and
qwen3_5_mtp.py; the proposer vllm/v1/spec_decode/llm_base_proposer.py; the config
vllm/config/speculative.py; HF transformers' modeling_qwen3_next.py / modeling_qwen3_5.py):

- Weight names: `mtp.fc.weight` [H, 2H], `mtp.pre_fc_norm_embedding.weight`,
  `mtp.pre_fc_norm_hidden.weight`, `mtp.layers.{i}.` + a decoder layer's own names
  (`input_layernorm`, `self_attn.{q,k,v,o}_proj`, `self_attn.{q,k}_norm`,
  `post_attention_layernorm`, `mlp.`...), `mtp.norm.weight` (both MTP files load the checkpoint's
  `mtp.` names into their predictor, `remap_weight_names`). The Qwen3.5 image-text checkpoints keep
  them at the top level too, not under `model.language_model.` (qwen3_5_mtp.py strips
  `language_model.` from the embedding's name only; transformers' Qwen3_5ForConditionalGeneration
  ignores `^mtp.*` on load). The head stores no embedding and no LM head of its own.
- MoE experts: one tensor per expert and projection, `mtp.layers.0.mlp.experts.{e}.gate_proj.weight`,
  as in the main layers (qwen3_next_mtp.py loads them through the main model's expert mapping);
  qwen3_5_mtp.py also takes them fused, `mlp.experts.gate_up_proj` [E, 2I, H] (each expert's gate
  rows, then its up rows; "no need to transpose") and `mlp.experts.down_proj` [E, H, I], as some
  Qwen3.5-MoE checkpoints store them. Both load here (`split_fused_experts`).
- Number of MTP layers: Qwen3-Next's config.json key `num_nextn_predict_layers` (qwen3_next_mtp.py
  takes 1 when it is absent), Qwen3.5's `mtp_num_hidden_layers`, at the top level or in
  `text_config` (speculative.py `hf_config_override`). hotpath reads it into
  `ModelConfig.mtp_num_layers`; where the config says nothing the loader counts the checkpoint's
  `mtp.layers.{i}`.
- fc's input is the concatenation [normed embedding, normed hidden], in that order
  (`torch.cat([inputs_embeds, hidden_states], dim=-1)` in both MTP files' forward).
- Every RMSNorm of the head is zero-centred (normalises with 1 + w), as the target's: the pre-fc
  norms and the final norm are Qwen3NextRMSNorm / Qwen3_5RMSNorm (GemmaRMSNorm in vLLM), and so are
  the layer's norms and QK-norm.
- The layer is a decoder layer of the target's own kind built as "full_attention"
  (`Qwen3NextDecoderLayer` / `Qwen3_5DecoderLayer(layer_type="full_attention",
  prefix="mtp.layers.{i}")`): gated attention (q_proj emits query and gate) with QK-norm and
  partial rotary. Its MLP follows the target's rule for layer index i (the index vLLM parses from
  the prefix; `mlp_only_layers`, `decoder_sparse_step`, `num_experts`): the shared-expert MoE block
  for Qwen3-Next and Qwen3.5-MoE, the dense gated MLP for dense Qwen3.5. So it is built here with
  the target family's `make_mlp(cfg, i)` and the plain self-attention of `CausalLM.make_mixer`.
- The target hidden state it takes is the target's forward output, after the target's final norm
  (vLLM's Qwen3NextForCausalLM.compute_logits applies the LM head to it directly; the proposer
  passes that output as `target_hidden_states`).
- Its own output after `mtp.norm` is both what the LM head turns into the draft's logits and the
  `hidden` fed back for the next draft (`model_returns_tuple()` is false for Qwen3NextMTP and
  Qwen3_5MTP, so last_hidden_states is hidden_states).
- Rows and positions (`set_inputs_first_pass`): after a target step over tokens x_0..x_t, the MTP
  runs over the same rows with positions unchanged and the input ids shifted by one: row t takes
  the target's hidden h_t (which predicted x_{t+1}), the token x_{t+1} (the token just sampled in
  each sequence's last row) and position t, and its K/V go to position t's slot (the target's block
  table and slot mapping). Its output at the last row gives draft 1 (a guess at x_{t+2}). Draft k+1
  runs one row per sequence at position t + k, with the token of draft k and the MTP output of the
  row before as `hidden`.
- The embedding and the LM head are the target's (`_maybe_share_embeddings` / `_maybe_share_lm_head`
  in llm_base_proposer.py: "Detected MTP model. Sharing target model ... weights"; Qwen3.5 configs
  say `mtp_use_dedicated_embeddings: false`): held here by reference, never copied or registered
  as this module's parameters.
- Quantized checkpoints: vLLM keeps `mtp.fc` in 16 bits where an NVFP4 checkpoint stores it so
  (qwen3_5_mtp.py); here each layer of the head takes the format its tensors are stored in
  (`load_mtp`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
import torch.nn as nn

from hotpath.config import ModelConfig
from hotpath.layers.embedding import LMHead, VocabEmbedding
from hotpath.layers.linear import Linear
from hotpath.layers.norm import RMSNorm
from hotpath.layers.rotary import RotaryEmbedding
from hotpath.models.decoder import CausalLM, CheckpointLoading, DecoderLayer, add_norm, reducing_group, rotary_table
from hotpath.layers.forward_batch import ForwardBatch

MTP_PREFIX = "mtp."


def supports_mtp(target: nn.Module) -> bool:
    """Whether the target's family publishes an MTP head (Qwen3-Next, Qwen3.5 dense and MoE)."""
    from hotpath.models.qwen3_next import Qwen3NextForCausalLM

    return isinstance(target, Qwen3NextForCausalLM)


class MtpHead(CheckpointLoading, nn.Module):
    """The checkpoint's `mtp.*` head on the target's embedding and LM head (see the module
    docstring); `forward` -> hidden states, `compute_logits`, `cache_layers`, `load_weights`.

    Under tensor parallelism (built inside the target's `building_parallel`) its layer splits as
    the target's layers do and returns a partial sum, reduced with the final norm (`add_norm`);
    fc and the pre-fc norms are replicated (the layer's input must be whole on every rank)."""

    def __init__(self, cfg: ModelConfig, num_layers: int, target: CausalLM, max_positions: int) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"an MTP head needs at least one layer, got {num_layers}")
        self.config = cfg
        H, eps, zc = cfg.hidden_size, cfg.rms_norm_eps, cfg.zero_centred_norms
        self.pre_fc_norm_embedding = RMSNorm(H, eps, zc)
        self.pre_fc_norm_hidden = RMSNorm(H, eps, zc)
        # replicated under tp: the layer's input norm and residual need the whole of x on every
        # rank, and fc is one [H, 2H] projection a step
        self.fc = Linear(2 * H, [H], parallel="replicated")
        rotary = rotary_table(target) or RotaryEmbedding(cfg.head_dim, cfg.rope, max_positions,
                                                          cfg.max_position_embeddings)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, *CausalLM.make_mixer(target, cfg, rotary, i), target.make_mlp(cfg, i))
            for i in range(num_layers))
        self.norm = RMSNorm(H, eps, zc)
        self.tp = reducing_group()  # the layer's MLP output is a partial sum under tp: reduced here
        # the target's modules, by reference: a tuple is not registered, so they stay out of this
        # module's parameters (dummy init, state_dict, .to()) and are never copied
        self._shared: tuple[VocabEmbedding, LMHead] = (target.model.embed_tokens, target.lm_head)

    @property
    def embed_tokens(self) -> VocabEmbedding:
        return self._shared[0]

    @property
    def lm_head(self) -> LMHead:
        return self._shared[1]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64: row t's token (x_{t+1} beside the target's h_t)
        positions: torch.Tensor,  # [T] int64
        batch: ForwardBatch,  # the target's block tables / slot mapping for these positions
        hidden: torch.Tensor,  # [T, H]: the target's output (after its final norm), or this head's
        step: int = 0,  # the draft step: layer step % num_layers runs
    ) -> torch.Tensor:  # [T, H], after the head's final norm: for compute_logits, and fed back
        e = self.pre_fc_norm_embedding(self.embed_tokens(input_ids))
        h = self.pre_fc_norm_hidden(hidden.to(e.dtype))
        x = self.fc(torch.cat([e, h], dim=-1))
        x, residual = self.layers[step % len(self.layers)](positions, x, None, batch)
        x, _ = add_norm(self.tp, self.norm, x, residual)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [rows, vocab] fp32
        return self.lm_head(hidden)

    def cache_layers(self) -> list[nn.Module]:
        """The head's attention layers (one per MTP layer), each with cache_spec / bind_cache;
        addressed by the target's block tables and slot mapping."""
        return [m for m in self.modules() if hasattr(m, "cache_spec")]

    # ---- loading ------------------------------------------------------------------------------
    def checkpoint_name(self, name: str) -> str | None:
        """`mtp.X` -> `X`; every other tensor (the target's) is not this module's."""
        return name[len(MTP_PREFIX):] if name.startswith(MTP_PREFIX) else None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(split_fused_experts(weights))


def split_fused_experts(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """A checkpoint stream with fused 16-bit MoE experts (`...mlp.experts.gate_up_proj` [E, 2I, H],
    `...mlp.experts.down_proj` [E, H, I]) as one tensor per expert and projection (views, no copy),
    the names the experts' loaders take; every other tensor passes as it is."""
    for name, tensor in weights:
        if name.endswith("mlp.experts.gate_up_proj") and tensor.dim() == 3:
            base = name.removesuffix("gate_up_proj")
            for e in range(tensor.shape[0]):
                gate, up = tensor[e].chunk(2, dim=0)
                yield f"{base}{e}.gate_proj.weight", gate
                yield f"{base}{e}.up_proj.weight", up
        elif name.endswith("mlp.experts.down_proj") and tensor.dim() == 3:
            base = name.removesuffix("down_proj")
            for e in range(tensor.shape[0]):
                yield f"{base}{e}.down_proj.weight", tensor[e]
        else:
            yield name, tensor
