"""Tiny random HF checkpoints written with save_pretrained, for parity tests against transformers."""

from __future__ import annotations

from pathlib import Path

import torch

# name -> (config class, kwargs); together they cover GQA 1:1, 4:1 and 8:1, tied and untied
# embeddings, head_dim != hidden / heads, q/k/v biases, QK-norm and rope scaling; and for MoE an
# odd expert count, top-k of 2 and 3, norm_topk_prob on and off, decoder_sparse_step 2 with
# mlp_only_layers (dense and sparse layers mixed), and Qwen2-MoE's shared expert.
TINY_CONFIGS = {
    "qwen2-gqa4-tied": ("Qwen2Config", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1000000.0)),
    "qwen3-gqa8-untied-hd": ("Qwen3Config", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=8,
        num_key_value_heads=1, head_dim=32, tie_word_embeddings=False)),
    "llama-mha-untied-llama3rope": ("LlamaConfig", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, tie_word_embeddings=False, max_position_embeddings=512,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "llama-gqa4-tied-hd": ("LlamaConfig", dict(
        hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, tie_word_embeddings=True)),
    "qwen3moe-e5-top2-norm": ("Qwen3MoeConfig", dict(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_experts=5, num_experts_per_tok=2,
        norm_topk_prob=True, tie_word_embeddings=False)),
    "qwen3moe-e7-top3-sparse2": ("Qwen3MoeConfig", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=1, head_dim=32, num_experts=7,
        num_experts_per_tok=3, norm_topk_prob=False, decoder_sparse_step=2, mlp_only_layers=[3],
        tie_word_embeddings=True)),  # sparse layers 1 and 5; 0, 2, 3 and 4 dense
    "qwen2moe-shared": ("Qwen2MoeConfig", dict(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        shared_expert_intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_experts=6, num_experts_per_tok=2, norm_topk_prob=False,
        tie_word_embeddings=False)),
    # hybrid: three Gated DeltaNet layers, then gated full attention (partial rotary, QK-norm);
    # zero-centred norms; the shared-expert MoE block
    "qwen3next-hybrid": ("Qwen3NextConfig", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
        norm_topk_prob=True, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"], tie_word_embeddings=False)),
    # Qwen3.5: the flat in_proj_qkv / z / b / a layout, mRoPE; dense, MoE, and the released
    # image-text checkpoint (text model under model.language_model, a vision tower to skip)
    "qwen3_5-dense": ("Qwen3_5TextConfig", dict(_QWEN3_5 := dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "full_attention"] * 2, tie_word_embeddings=True))),
    "qwen3_5-moe": ("Qwen3_5MoeTextConfig", dict(
        _QWEN3_5, moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=5,
        num_experts_per_tok=2, tie_word_embeddings=False)),
    # image-text models with their vision towers (placeholder ids inside the tiny vocabulary):
    # Qwen3-VL with DeepStack after two of three tower layers, its MoE with fused experts in the
    # published layout, Qwen3.5 dense and MoE (no DeepStack); mRoPE sections of a 16-wide rotary
    "qwen3vl": ("Qwen3VLConfig", dict(
        text_config=dict(_VL_TEXT := dict(
            hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})),
        vision_config=dict(_VL_VISION := dict(
            depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
            num_position_embeddings=16), deepstack_visual_indexes=[0, 1]),
        **(_VL_IDS := dict(image_token_id=500, video_token_id=501, vision_start_token_id=502,
                           vision_end_token_id=503)),
        model_class="Qwen3VLForConditionalGeneration")),
    "qwen3vl-moe": ("Qwen3VLMoeConfig", dict(
        text_config=dict(_VL_TEXT, moe_intermediate_size=40, num_experts=5, num_experts_per_tok=2),
        vision_config=dict(_VL_VISION, deepstack_visual_indexes=[1]), **_VL_IDS,
        model_class="Qwen3VLMoeForConditionalGeneration")),
    "qwen3_5-vl": ("Qwen3_5Config", dict(
        text_config=dict(_QWEN3_5, head_dim=32, tie_word_embeddings=False, rope_parameters={
            "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
            "mrope_section": [2, 3, 3], "mrope_interleaved": True}),
        vision_config=_VL_VISION, **_VL_IDS, model_class="Qwen3_5ForConditionalGeneration")),
    "qwen3_5moe-vl": ("Qwen3_5MoeConfig", dict(
        text_config=dict(_QWEN3_5, head_dim=32, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                         num_experts=5, num_experts_per_tok=2, tie_word_embeddings=False, rope_parameters={
                             "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                             "mrope_section": [2, 3, 3], "mrope_interleaved": True}),
        vision_config=_VL_VISION, **_VL_IDS, model_class="Qwen3_5MoeForConditionalGeneration")),
    "qwen3_5-image-text": ("Qwen3_5Config", dict(
        text_config=dict(_QWEN3_5, tie_word_embeddings=False),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=64),
        model_class="Qwen3_5ForConditionalGeneration")),
}


def make_tiny_model(name: str, out_dir: Path, vocab_size: int = 512, seed: int = 0, mtp_layers: int = 0,
                    fused_mtp_experts: bool = False):
    """Writes the checkpoint to out_dir and returns the HF model (fp32, eval). `mtp_layers` > 0 (the
    hybrid models): the checkpoint also carries a multi-token-prediction head (add_mtp_weights),
    which HF's model does not have; the rest of the checkpoint is the same as without it."""
    import transformers

    cls_name, kwargs = TINY_CONFIGS[name]
    config_cls = getattr(transformers, cls_name)
    kwargs = dict(kwargs)
    model_class = kwargs.pop("model_class", None)
    text = dict(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2, max_position_embeddings=1024)
    if "text_config" in kwargs:  # an image-text model: the text settings go to its text model
        kwargs["text_config"] = {**text, **kwargs["text_config"]}
        config = config_cls(**kwargs)
    else:
        config = config_cls(**{**text, **kwargs})
    torch.manual_seed(seed)
    if model_class:
        model = getattr(transformers, model_class)(config).eval()
    else:
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
    # the default init leaves norms at 1 and biases at 0; random values make the test stricter
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname or pname.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
            if pname.endswith("mlp.gate.weight"):  # MoE routers: decisive routing, not near-uniform
                p.mul_(50)
    model.save_pretrained(out_dir)
    if mtp_layers:
        add_mtp_weights(out_dir, mtp_layers, seed, fused_mtp_experts)
    return model


def add_mtp_weights(out_dir: Path, num_layers: int = 1, seed: int = 0, fused_experts: bool = False) -> None:
    """Adds a multi-token-prediction head to the hybrid checkpoint in out_dir (HF's save_pretrained
    drops it), in the published layout (hotpath/models/mtp.py): `mtp.fc` [H, 2H], the zero-centred
    norms `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`, `mtp.norm`, and `mtp.layers.{i}.*`,
    each a full-attention decoder layer (gated q_proj, QK-norm) with the MLP the model's rule gives
    layer i (shared-expert MoE or dense); experts one tensor per expert and projection, or with
    `fused_experts` as `experts.gate_up_proj` [E, 2I, H] / `experts.down_proj` [E, H, I]. The
    config gets the layer count under the family's key: Qwen3-Next's num_nextn_predict_layers,
    Qwen3.5's mtp_num_hidden_layers (in text_config for the image-text model). Random values as
    make_tiny_model's (normal, std = initializer_range; norms 0.1 around 0; routers x 50), drawn
    from their own generator, so the model's own tensors are untouched."""
    import json

    from safetensors.torch import load_file, save_file

    config_path = out_dir / "config.json"
    config = json.loads(config_path.read_text())
    text = config.get("text_config", config)
    key = "num_nextn_predict_layers" if text.get("model_type") == "qwen3_next" else "mtp_num_hidden_layers"
    text[key] = num_layers
    config_path.write_text(json.dumps(config, indent=2))

    g = torch.Generator().manual_seed(10_000 + seed)
    std = text.get("initializer_range", 0.02)

    def matrix(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std * scale

    def norm(n: int) -> torch.Tensor:  # stored as w - 1
        return torch.randn(n, generator=g) * 0.1

    H, hd = text["hidden_size"], text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    heads, kv = text["num_attention_heads"], text.get("num_key_value_heads") or text["num_attention_heads"]
    tensors = {"mtp.fc.weight": matrix(H, 2 * H), "mtp.pre_fc_norm_embedding.weight": norm(H),
               "mtp.pre_fc_norm_hidden.weight": norm(H), "mtp.norm.weight": norm(H)}
    num_experts = text.get("num_experts", 0)
    for i in range(num_layers):
        p = f"mtp.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": norm(H), p + "post_attention_layernorm.weight": norm(H),
            p + "self_attn.q_proj.weight": matrix(2 * heads * hd, H),  # each head's query, then its gate
            p + "self_attn.k_proj.weight": matrix(kv * hd, H), p + "self_attn.v_proj.weight": matrix(kv * hd, H),
            p + "self_attn.o_proj.weight": matrix(H, heads * hd),
            p + "self_attn.q_norm.weight": norm(hd), p + "self_attn.k_norm.weight": norm(hd),
        })
        sparse = (num_experts > 0 and i not in (text.get("mlp_only_layers") or [])
                  and (i + 1) % text.get("decoder_sparse_step", 1) == 0)
        if not sparse:
            inter = text["intermediate_size"]
            tensors.update({p + "mlp.gate_proj.weight": matrix(inter, H), p + "mlp.up_proj.weight": matrix(inter, H),
                            p + "mlp.down_proj.weight": matrix(H, inter)})
            continue
        inter, shared = text["moe_intermediate_size"], text["shared_expert_intermediate_size"]
        gate, up, down = matrix(num_experts, inter, H), matrix(num_experts, inter, H), matrix(num_experts, H, inter)
        if fused_experts:
            tensors[p + "mlp.experts.gate_up_proj"] = torch.cat([gate, up], dim=1)
            tensors[p + "mlp.experts.down_proj"] = down
        else:
            for e in range(num_experts):
                tensors.update({p + f"mlp.experts.{e}.gate_proj.weight": gate[e].clone(),
                                p + f"mlp.experts.{e}.up_proj.weight": up[e].clone(),
                                p + f"mlp.experts.{e}.down_proj.weight": down[e].clone()})
        tensors.update({
            p + "mlp.gate.weight": matrix(num_experts, H, scale=50),  # decisive routing
            p + "mlp.shared_expert.gate_proj.weight": matrix(shared, H),
            p + "mlp.shared_expert.up_proj.weight": matrix(shared, H),
            p + "mlp.shared_expert.down_proj.weight": matrix(H, shared),
            p + "mlp.shared_expert_gate.weight": matrix(1, H),
        })
    files = list(out_dir.glob("*.safetensors"))
    if len(files) != 1 or (out_dir / "model.safetensors.index.json").exists():
        raise ValueError(f"add_mtp_weights expects one unsharded safetensors file in {out_dir}")
    save_file({**load_file(files[0]), **tensors}, files[0], metadata={"format": "pt"})


def perturbed_copy(src: Path, out: Path, generator: torch.Generator, scale: float) -> Path:
    """A copy of the checkpoint at `src` in `out` with each matrix perturbed by noise of `scale`
    times its std: a draft model that agrees with its target most of the time, not always."""
    import shutil

    from safetensors.torch import load_file, save_file

    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    for f in src.glob("*.safetensors"):
        noisy = {k: v + scale * v.std() * torch.randn(v.shape, generator=generator) if v.dim() >= 2 else v
                 for k, v in load_file(f).items()}
        save_file(noisy, out / f.name, metadata={"format": "pt"})
    return out
