"""A reference for the multi-token-prediction head (hotpath/models/mtp.py) built from HF
transformers' own classes: the family's full-attention decoder layer and zero-centred RMSNorm loaded
with the checkpoint's mtp.layers.0 weights, fc and the concatenation as vLLM's MTP files apply them."""

from __future__ import annotations

import copy

import torch


def mtp_tensors(path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    (f,) = path.glob("*.safetensors")
    return {k: v for k, v in load_file(f).items() if k.startswith("mtp.")}


@torch.no_grad()
def hf_reference(hf_model, tensors: dict[str, torch.Tensor], ids: torch.Tensor,
                  hidden: torch.Tensor) -> torch.Tensor:
    """The MTP head over one sequence (positions 0..T-1, causal) from transformers' classes:
    norm(layer(fc(cat[pre_fc_norm_embedding(embed(ids)), pre_fc_norm_hidden(hidden)])))."""
    import importlib

    import torch.nn.functional as F

    cfg = copy.deepcopy(hf_model.config.get_text_config())
    cfg._attn_implementation = "eager"
    family = {"qwen3_next": "Qwen3Next", "qwen3_5_text": "Qwen3_5", "qwen3_5_moe_text": "Qwen3_5Moe"}[cfg.model_type]
    hf = importlib.import_module(type(hf_model).__module__)
    Norm, Layer = getattr(hf, f"{family}RMSNorm"), getattr(hf, f"{family}DecoderLayer")

    def norm(name: str) -> torch.nn.Module:
        m = Norm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        m.weight.copy_(tensors[f"mtp.{name}.weight"])
        return m

    layer = Layer(cfg, cfg.layer_types.index("full_attention")).eval()
    state = {k.removeprefix("mtp.layers.0."): v for k, v in tensors.items() if k.startswith("mtp.layers.0.")}
    experts = sorted({int(k.split(".")[2]) for k in state if k.startswith("mlp.experts.")
                      and k.split(".")[2].isdigit()})
    if experts:  # HF holds the experts stacked: gate_up [E, 2I, H] (gate rows, then up), down [E, H, I]
        stacked = {proj: torch.stack([state.pop(f"mlp.experts.{e}.{proj}_proj.weight") for e in experts])
                   for proj in ("gate", "up", "down")}
        state["mlp.experts.gate_up_proj"] = torch.cat([stacked["gate"], stacked["up"]], dim=1)
        state["mlp.experts.down_proj"] = stacked["down"]
    layer.load_state_dict(state, strict=True)
    rotary = next(m for n, m in hf_model.named_modules() if n.endswith("rotary_emb") and "visual" not in n)

    T = ids.shape[0]
    e = norm("pre_fc_norm_embedding")(hf_model.get_input_embeddings().weight[ids])
    x = F.linear(torch.cat([e, norm("pre_fc_norm_hidden")(hidden)], dim=-1), tensors["mtp.fc.weight"])[None]
    position_ids = torch.arange(T)[None]
    mask = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)[None, None]
    x = layer(x, position_embeddings=rotary(x, position_ids), attention_mask=mask, position_ids=position_ids)
    return norm("norm")(x)[0]
