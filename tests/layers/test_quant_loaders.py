"""Every quantized format's loader on hand-built tiny checkpoints: the layers hold exactly the
weights the files encode. The files are packed here with plain loops written from the format
descriptions (not with hotpath's packing code), from random integers and scales whose products
are exact in fp32."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hotpath.layers.linear import Linear, UnquantizedLinearMethod
from hotpath.layers.quant.detect import read_quant_config
from hotpath.loader.model_loader import load_model
from hotpath.models.registry import read_config
from hotpath.ops.quant.reference import (
    MIN_SCALE_FACTOR,
    dequantize_fp8,
    dequantize_int4,
    dequantize_stored,
)

HIDDEN, HEADS, HEAD_DIM, KV_HEADS, INTER, LAYERS, VOCAB = 128, 8, 32, 4, 256, 2, 256
LINEARS = {  # checkpoint module -> (out, in)
    "self_attn.q_proj": (HEADS * HEAD_DIM, HIDDEN), "self_attn.k_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
    "self_attn.v_proj": (KV_HEADS * HEAD_DIM, HIDDEN), "self_attn.o_proj": (HIDDEN, HEADS * HEAD_DIM),
    "mlp.gate_proj": (INTER, HIDDEN), "mlp.up_proj": (INTER, HIDDEN), "mlp.down_proj": (HIDDEN, INTER),
}
FUSED = {"self_attn.qkv_proj": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
         "self_attn.o_proj": ["self_attn.o_proj"],
         "mlp.gate_up_proj": ["mlp.gate_proj", "mlp.up_proj"], "mlp.down_proj": ["mlp.down_proj"]}
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
SHARED_INPUT = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}


def qwen3_config(quantization_config: dict | None) -> dict:
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": HIDDEN,
              "intermediate_size": INTER, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
              "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": VOCAB,
              "rms_norm_eps": 1e-6, "max_position_embeddings": 256, "tie_word_embeddings": False,
              "torch_dtype": "bfloat16", "hidden_act": "silu"}
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    return config


def write_checkpoint(path: Path, config: dict, linear_tensors, linears: dict = LINEARS
                     ) -> dict[str, torch.Tensor]:
    """A tiny Qwen3 whose every linear gets linear_tensors(name, out, in, gen) -> (its checkpoint
    tensors by suffix, its exact dense weight); returns {module name: dense weight}."""
    g = torch.Generator().manual_seed(0)
    tensors = {"model.embed_tokens.weight": torch.randn(VOCAB, HIDDEN, generator=g),
               "lm_head.weight": torch.randn(VOCAB, HIDDEN, generator=g),
               "model.norm.weight": torch.rand(HIDDEN, generator=g) + 0.5}
    dense = {}
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"{p}.{norm}.weight"] = torch.rand(HIDDEN, generator=g) + 0.5
        for norm in ("q_norm", "k_norm"):
            tensors[f"{p}.self_attn.{norm}.weight"] = torch.rand(HEAD_DIM, generator=g) + 0.5
        for name, (n, k) in linears.items():
            parts, w = linear_tensors(f"{p}.{name}", n, k, g)
            dense[f"{p}.{name}"] = w
            for suffix, t in parts.items():
                tensors[f"{p}.{name}.{suffix}"] = t
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, path / "model.safetensors")
    (path / "config.json").write_text(json.dumps(config))
    return dense


def load(path: Path, quantization: str | None = None):
    cfg = read_config(path)
    cfg.quantization = read_quant_config(path, quantization)
    return load_model(cfg, path, "auto", torch.device("cpu"), torch.float32, 64)


def fused_dense(dense: dict[str, torch.Tensor], layer: int, fused: str) -> torch.Tensor:
    return torch.cat([dense[f"model.layers.{layer}.{n}"] for n in FUSED[fused]])


def random_fp8(n: int, k: int, g: torch.Generator) -> torch.Tensor:
    return (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)


def pack_rows_awq(values: torch.Tensor) -> torch.Tensor:
    """[R, C] 0..15 -> int32 [R, C/8]: nibble i of word w holds column 8w + AWQ_ORDER[i]."""
    R, C = values.shape
    out = torch.zeros(R, C // 8, dtype=torch.int64)
    for w in range(C // 8):
        for i in range(8):
            out[:, w] |= values[:, 8 * w + AWQ_ORDER[i]].long() << (4 * i)
    return (out - (out >= 2**31).long() * 2**32).to(torch.int32)


def pack_sequential(values: torch.Tensor, dim: int) -> torch.Tensor:
    """Packs 8 consecutive entries along `dim` into one int32, entry j in bits 4j..4j+3."""
    v = values.long().movedim(dim, 0)
    out = torch.zeros(v.shape[0] // 8, *v.shape[1:], dtype=torch.int64)
    for w in range(v.shape[0] // 8):
        for j in range(8):
            out[w] |= v[8 * w + j] << (4 * j)
    out = out - (out >= 2**31).long() * 2**32
    return out.to(torch.int32).movedim(0, dim).contiguous()


def test_fp8_block_checkpoint_loads_exact(tmp_path):
    def tensors(name, n, k, g):
        w = random_fp8(n, k, g)
        scale = (torch.rand(-(-n // 128), -(-k // 128), generator=g) + 0.5).to(torch.bfloat16)
        dense = w.float() * scale.float().repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
        return {"weight": w, "weight_scale_inv": scale}, dense

    qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    dense = write_checkpoint(tmp_path, qwen3_config(qc), tensors)
    model = load(tmp_path)
    for i in range(LAYERS):
        layer = model.model.layers[i]
        for fused in FUSED:
            lin = layer.get_submodule(fused)
            assert lin.weight.dtype == torch.float8_e4m3fn and lin.weight_scale_inv.dtype == torch.float32
            got = dequantize_fp8(lin.weight, lin.weight_scale_inv, (128, 128))
            assert torch.equal(got, fused_dense(dense, i, fused)), fused
    assert model.lm_head.weight.dtype == torch.float32  # the LM head stays in the model dtype


def test_compressed_tensors_fp8_channel_loads_exact_and_ignores(tmp_path):
    ignored = "model.layers.1.mlp.down_proj"

    def tensors(name, n, k, g):
        if name == ignored:
            w = torch.randn(n, k, generator=g)
            return {"weight": w}, w
        w = random_fp8(n, k, g)
        scale = (torch.rand(n, 1, generator=g) + 0.01).to(torch.bfloat16)
        return {"weight": w, "weight_scale": scale}, w.float() * scale.float()

    args = dict(num_bits=8, type="float", symmetric=True, group_size=None, block_structure=None)
    qc = {"quant_method": "compressed-tensors", "format": "float-quantized",
          "config_groups": {"group_0": {"targets": ["Linear"],
                                        "weights": {**args, "strategy": "channel", "dynamic": False},
                                        "input_activations": {**args, "strategy": "token", "dynamic": True}}},
          "ignore": ["lm_head", ignored]}
    dense = write_checkpoint(tmp_path, qwen3_config(qc), tensors)
    model = load(tmp_path)
    for i in range(LAYERS):
        for fused in FUSED:
            lin = model.model.layers[i].get_submodule(fused)
            if f"model.layers.{i}.{fused}" == ignored:
                assert isinstance(lin.method, UnquantizedLinearMethod)
                assert torch.equal(lin.weight, dense[ignored])
                continue
            assert lin.weight_scale.shape == (lin.weight.shape[0],)
            assert torch.equal(dequantize_fp8(lin.weight, lin.weight_scale, None), fused_dense(dense, i, fused))


def _int4_values(n: int, k: int, G: int, g: torch.Generator):
    q = torch.randint(0, 16, (n, k), generator=g)
    zeros = torch.randint(0, 16, (n, k // G), generator=g)
    scales = (torch.rand(n, k // G, generator=g) * 0.1 + 0.001).to(torch.float16)
    return q, zeros, scales


def awq_linear_tensors(G: int):
    """write_checkpoint's linear_tensors for AWQ with groups of G, and the quantization_config."""
    def tensors(name, n, k, g):
        q, zeros, scales = _int4_values(n, k, G, g)
        gidx = torch.arange(k) // G
        dense = (q - zeros[:, gidx]).float() * scales.float()[:, gidx]
        return {"qweight": pack_rows_awq(q.T), "qzeros": pack_rows_awq(zeros.T),
                "scales": scales.T.contiguous()}, dense

    return tensors, {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": G, "zero_point": True,
                     "modules_to_not_convert": None}


@pytest.mark.parametrize("G", [32, 128])
def test_awq_checkpoint_loads_exact(tmp_path, G):
    tensors, qc = awq_linear_tensors(G)
    dense = write_checkpoint(tmp_path, qwen3_config(qc), tensors)
    model = load(tmp_path)
    for i in range(LAYERS):
        for fused in FUSED:
            lin = model.model.layers[i].get_submodule(fused)
            N, K = lin.qweight.shape[0], lin.qweight.shape[1] * 8
            assert lin.qweight.dtype == torch.int32 and lin.qzeros.dtype == torch.uint8
            assert lin.scales.shape == (N, K // G) and lin.g_idx is None and lin.perm is None
            got = dequantize_int4(lin.qweight, lin.scales, lin.qzeros, G)
            assert torch.equal(got, fused_dense(dense, i, fused)), fused


@pytest.mark.parametrize("desc_act,fmt", [(False, "gptq"), (True, "gptq"), (False, "gptq_v2")])
def test_gptq_checkpoint_loads_exact(tmp_path, desc_act, fmt):
    G = 32
    perms = {}  # one g_idx per input: projections that share an input share it

    def tensors(name, n, k, g):
        q, zeros, scales = _int4_values(n, k, G, g)
        if desc_act:
            module, _, proj = name.rpartition(".")
            key = (module, SHARED_INPUT.get(proj, proj))
            if key not in perms:
                perms[key] = torch.randperm(k, generator=g)
            gidx = torch.empty(k, dtype=torch.long)
            gidx[perms[key]] = torch.arange(k) // G
        else:
            gidx = torch.arange(k) // G
        dense = (q - zeros[:, gidx]).float() * scales.float()[:, gidx]
        stored_zeros = (zeros - 1) & 0xF if fmt == "gptq" else zeros
        return {"qweight": pack_sequential(q.T, 0), "qzeros": pack_sequential(stored_zeros.T, 1),
                "scales": scales.T.contiguous(), "g_idx": gidx.to(torch.int32)}, dense

    qc = {"quant_method": "gptq", "bits": 4, "group_size": G, "desc_act": desc_act, "sym": False,
          "checkpoint_format": fmt}
    dense = write_checkpoint(tmp_path, qwen3_config(qc), tensors)
    model = load(tmp_path)
    for i in range(LAYERS):
        for fused in FUSED:
            lin = model.model.layers[i].get_submodule(fused)
            assert (lin.g_idx is not None) == desc_act and (lin.perm is not None) == desc_act
            got = dequantize_int4(lin.qweight, lin.scales, lin.qzeros, G, lin.g_idx)
            assert torch.equal(got, fused_dense(dense, i, fused)), fused
            if desc_act:  # what the kernels read: x's columns through perm, the stored weight
                stored = dequantize_stored(lin.qweight, lin.scales, lin.qzeros, G)
                assert torch.equal(stored, fused_dense(dense, i, fused)[:, lin.perm.long()]), fused


def test_gptq_fused_projections_with_different_g_idx_are_refused(tmp_path):
    G = 32

    def tensors(name, n, k, g):
        q, zeros, scales = _int4_values(n, k, G, g)
        gidx = torch.randperm(k, generator=g) // G  # each projection its own
        return {"qweight": pack_sequential(q.T, 0), "qzeros": pack_sequential(zeros.T, 1),
                "scales": scales.T.contiguous(), "g_idx": gidx.to(torch.int32)}, q.float()

    qc = {"quant_method": "gptq", "bits": 4, "group_size": G, "desc_act": True}
    write_checkpoint(tmp_path, qwen3_config(qc), tensors)
    with pytest.raises(ValueError, match="different g_idx"):
        load(tmp_path)


def test_online_fp8_quantizes_each_row_while_loading(tmp_path):
    def tensors(name, n, k, g):
        w = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g)  # rows of varied range
        return {"weight": w}, w

    dense = write_checkpoint(tmp_path, qwen3_config(None), tensors)
    model = load(tmp_path, "fp8")
    for i in range(LAYERS):
        for fused in FUSED:
            lin = model.model.layers[i].get_submodule(fused)
            w = fused_dense(dense, i, fused)
            assert lin.weight.dtype == torch.float8_e4m3fn
            expected_scale = (w.abs().amax(1) / 448).clamp(min=MIN_SCALE_FACTOR / 448)  # floored
            torch.testing.assert_close(lin.weight_scale, expected_scale, rtol=1e-6, atol=0)
            got = dequantize_fp8(lin.weight, lin.weight_scale, None)
            # e4m3 keeps 3 mantissa bits: within half a step (1/16 relative) of the row's values,
            # and the row maximum exact where the scale is not floored
            assert ((got - w).abs() <= w.abs() / 16 + expected_scale[:, None] * 2**-9).all()
            full = w.abs().amax(1) >= MIN_SCALE_FACTOR
            assert full.sum() > len(full) // 2
            assert torch.allclose(got.abs().amax(1)[full], w.abs().amax(1)[full], rtol=1e-6)


def test_misaligned_fused_fp8_blocks_are_refused_at_load(tmp_path):
    def tensors(name, n, k, g):
        w = random_fp8(n, k, g)
        scale = torch.ones(-(-n // 128), -(-k // 128))
        return {"weight": w, "weight_scale_inv": scale}, w.float()

    config = qwen3_config({"quant_method": "fp8", "weight_block_size": [128, 128]})
    config["num_key_value_heads"] = 2  # a k part of 64 rows: the v part cannot start a block
    linears = {**LINEARS, "self_attn.k_proj": (64, HIDDEN), "self_attn.v_proj": (64, HIDDEN)}
    write_checkpoint(tmp_path, config, tensors, linears)
    with pytest.raises(ValueError, match="whole 128-row blocks"):
        load(tmp_path)


def test_linear_layers_take_the_method_of_the_model_being_built():
    from hotpath.layers.quant.awq import AwqConfig, AwqLinearMethod
    from hotpath.layers.quant.base import building_with

    with building_with(AwqConfig(32)):
        lin = Linear(64, [32, 32])
    plain = Linear(64, [32])
    assert isinstance(lin.method, AwqLinearMethod) and lin.qweight.shape == (64, 8)
    assert isinstance(plain.method, UnquantizedLinearMethod)
    lin.set_method(UnquantizedLinearMethod())
    assert lin.weight.shape == (64, 64) and not hasattr(lin, "qweight")


MOE_EXPERTS, MOE_INTER = 3, 192  # 192 rows: gate and up each end on a partial 128-row block
CT_ARGS = dict(num_bits=8, type="float", symmetric=True, group_size=None, block_structure=None)
FP8_MOE_FORMATS = {  # name -> (quantization_config, scale suffix, block size)
    "fp8-block": ({"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
                  "weight_scale_inv", (128, 128)),
    "ct-channel": ({"quant_method": "compressed-tensors", "format": "float-quantized",
                    "config_groups": {"group_0": {
                        "targets": ["Linear"],
                        "weights": {**CT_ARGS, "strategy": "channel", "dynamic": False},
                        "input_activations": {**CT_ARGS, "strategy": "token", "dynamic": True}}},
                    "ignore": ["lm_head"]}, "weight_scale", None),
    "online": (None, None, None),
}


def write_moe_checkpoint(path: Path, fmt: str) -> tuple[dict, dict, dict]:
    """A tiny Qwen3-MoE in format `fmt` (attention and experts quantized, routers 16-bit):
    (dense weights, checkpoint tensors, routers) by checkpoint name."""
    qc, scale_name, block = FP8_MOE_FORMATS[fmt]
    written = {}

    def tensors(name, n, k, g):
        if scale_name is None:
            w = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g)
            parts = {"weight": w}
        else:
            w8 = random_fp8(n, k, g)
            shape = (n, 1) if block is None else (-(-n // 128), -(-k // 128))
            scale = (torch.rand(*shape, generator=g) + 0.5).to(torch.bfloat16)
            expand = scale.float() if block is None else \
                scale.float().repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
            parts, w = {"weight": w8, scale_name: scale}, w8.float() * expand
        written[name] = parts
        return parts, w

    dense, routers = write_moe_with(path, qc, tensors)
    return dense, written, routers


def write_moe_with(path: Path, quantization_config: dict | None, tensors,
                   experts: int = MOE_EXPERTS) -> tuple[dict, dict]:
    """A tiny Qwen3-MoE whose attention and expert projections get tensors(name, out, in, gen)
    (see write_checkpoint), its routers 16-bit: (dense weights, routers) by checkpoint name."""
    linears = {k: v for k, v in LINEARS.items() if k.startswith("self_attn")}
    for e in range(experts):
        linears[f"mlp.experts.{e}.gate_proj"] = (MOE_INTER, HIDDEN)
        linears[f"mlp.experts.{e}.up_proj"] = (MOE_INTER, HIDDEN)
        linears[f"mlp.experts.{e}.down_proj"] = (HIDDEN, MOE_INTER)
    config = qwen3_config(quantization_config)
    config.update(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_experts=experts,
                  num_experts_per_tok=2, moe_intermediate_size=MOE_INTER, norm_topk_prob=True)
    dense = write_checkpoint(path, config, tensors, linears)
    from safetensors.torch import load_file
    weights = load_file(path / "model.safetensors")
    routers = {f"model.layers.{i}.mlp.gate.weight": torch.randn(experts, HIDDEN) for i in range(LAYERS)}
    save_file({**weights, **routers}, path / "model.safetensors")
    return dense, routers


@pytest.mark.parametrize("device_fp8", [torch.float8_e4m3fn, torch.float8_e4m3fnuz])
@pytest.mark.parametrize("fmt", list(FP8_MOE_FORMATS))
def test_fp8_moe_experts_load_as_fp8_and_router_stays_unquantized(tmp_path, monkeypatch, fmt, device_fp8):
    """Qwen3-30B-A3B-FP8's layout (per-expert fp8 weight + weight_scale_inv), compressed-tensors'
    per channel, and online fp8: the experts load into the stacked fp8 w13 / w2 and their fp32
    scales, gate and up keeping their own block rows, and dequantize to exactly the checkpoint's
    weights (online: to its per-row quantization). As gfx942's e4m3fnuz too (the bits converted,
    the scales doubled: the same values). The router stays in the model dtype."""
    import hotpath.layers.moe as moe_layer
    from hotpath.ops.moe.reference import dequantize_experts
    from hotpath.ops.quant.reference import quantize_fp8_per_token

    monkeypatch.setattr(moe_layer, "fp8_dtype", lambda device: device_fp8)
    dense, written, routers = write_moe_checkpoint(tmp_path, fmt)
    _, scale_name, block = FP8_MOE_FORMATS[fmt]
    model = load(tmp_path, "fp8" if fmt == "online" else None)
    for i in range(LAYERS):
        mlp = model.model.layers[i].mlp
        assert isinstance(mlp.gate.method, UnquantizedLinearMethod)
        assert torch.equal(mlp.gate.weight, routers[f"model.layers.{i}.mlp.gate.weight"])
        experts = mlp.experts
        assert experts.w13.dtype == experts.w2.dtype == device_fp8
        assert experts.w13_scale.dtype == experts.w2_scale.dtype == torch.float32
        if block is None:
            assert experts.w13_scale.shape == (MOE_EXPERTS, 2 * MOE_INTER)
            assert experts.w2_scale.shape == (MOE_EXPERTS, HIDDEN)
        else:
            assert experts.w13_scale.shape == (MOE_EXPERTS, 2 * 2, 1)
            assert experts.w2_scale.shape == (MOE_EXPERTS, 1, 2)
        for e in range(MOE_EXPERTS):
            p = f"model.layers.{i}.mlp.experts.{e}"
            want13 = torch.cat([dense[f"{p}.gate_proj"], dense[f"{p}.up_proj"]])
            want2 = dense[f"{p}.down_proj"]
            if fmt == "online":
                for want, w, s in ((want13, experts.w13[e], experts.w13_scale[e]),
                                   (want2, experts.w2[e], experts.w2_scale[e])):
                    q, scale = quantize_fp8_per_token(want, device_fp8)
                    assert torch.equal(w.view(torch.uint8), q.view(torch.uint8))
                    assert torch.equal(s, scale)
                continue
            assert torch.equal(dequantize_experts(experts.w13[e], experts.w13_scale[e], block, 2), want13)
            assert torch.equal(dequantize_experts(experts.w2[e], experts.w2_scale[e], block, 1), want2)
            if device_fp8 == torch.float8_e4m3fn:  # the checkpoint's bytes, as they are
                gate_up = torch.cat([written[f"{p}.gate_proj"]["weight"], written[f"{p}.up_proj"]["weight"]])
                assert torch.equal(experts.w13[e].view(torch.uint8), gate_up.view(torch.uint8))


def test_dummy_fp8_experts_are_fp8_with_positive_scales(tmp_path):
    """load_format="dummy" (the benchmarks' random weights) fills fp8 experts and their scales."""
    write_moe_checkpoint(tmp_path, "fp8-block")
    cfg = read_config(tmp_path)
    cfg.quantization = read_quant_config(tmp_path)
    model = load_model(cfg, tmp_path, "dummy", torch.device("cpu"), torch.bfloat16, 64)
    experts = model.model.layers[0].mlp.experts
    assert experts.w13.dtype == torch.float8_e4m3fn and experts.w13.float().std() > 0.5
    for scale in (experts.w13_scale, experts.w2_scale):
        assert scale.dtype == torch.float32 and (scale > 0).all()


def test_experts_reset_to_the_model_dtype_drop_their_fp8_parameters():
    """The loader sets checkpoint_quant to None for experts a format's ignore list names: the
    parameters are made anew in the model dtype, without scales, and load 16-bit tensors."""
    from hotpath.layers.moe import FusedExperts
    from hotpath.layers.quant.base import building_with
    from hotpath.layers.quant.fp8_block import Fp8BlockConfig

    with building_with(Fp8BlockConfig()):
        experts = FusedExperts(4, 128, 64)
    assert experts.w13.dtype == torch.float8_e4m3fn and experts.w13_scale.shape == (4, 2, 1)
    assert set(experts.checkpoint_tensors("e")) == {f"e.{i}.{p}.{s}" for i in range(4)
                                                    for p in ("gate_proj", "up_proj", "down_proj")
                                                    for s in ("weight", "weight_scale_inv")}
    experts.checkpoint_quant = None
    assert [n for n, _ in experts.named_parameters()] == ["w13", "w2"]
    assert experts.w13.dtype == torch.get_default_dtype() and experts.w2.shape == (4, 128, 64)
    up = torch.randn(64, 128)
    experts.checkpoint_tensors("e")["e.2.up_proj.weight"](up)
    assert torch.equal(experts.w13[2, 64:], up)


INT4_MOE_GROUP = 64  # divides HIDDEN and MOE_INTER
# int4 formats build the router as an int4 Linear before the loader resets it to the model dtype,
# which needs its outputs (the experts) a multiple of 8
INT4_MOE_EXPERTS = 8


def int4_tensors(fmt: str, G: int, act_order: bool = False):
    """write_checkpoint's tensors for AWQ ("awq") or GPTQ ("gptq": v1 zeros, "gptq_v2"), packed
    by this file's loops; GPTQ's g_idx plain, or each projection's own permutation (act_order)."""
    def tensors(name, n, k, g):
        q, zeros, scales = _int4_values(n, k, G, g)
        gidx = torch.randperm(k, generator=g) // G if act_order else torch.arange(k) // G
        dense = (q - zeros[:, gidx]).float() * scales.float()[:, gidx]
        if fmt == "awq":
            return {"qweight": pack_rows_awq(q.T), "qzeros": pack_rows_awq(zeros.T),
                    "scales": scales.T.contiguous()}, dense
        stored_zeros = (zeros - 1) & 0xF if fmt == "gptq" else zeros
        return {"qweight": pack_sequential(q.T, 0), "qzeros": pack_sequential(stored_zeros.T, 1),
                "scales": scales.T.contiguous(), "g_idx": gidx.to(torch.int32)}, dense
    return tensors


def int4_quantization_config(fmt: str, G: int, desc_act: bool = False) -> dict:
    if fmt == "awq":
        return {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": G, "zero_point": True,
                "modules_to_not_convert": None}
    return {"quant_method": "gptq", "bits": 4, "group_size": G, "desc_act": desc_act, "sym": False,
            "checkpoint_format": fmt}


@pytest.mark.parametrize("fmt", ["awq", "gptq", "gptq_v2"])
def test_int4_moe_experts_load_as_int4(tmp_path, fmt):
    """AWQ and GPTQ (plain order) experts load into the stacked int4 parameters in the kernels'
    layout (words [E, 2I, H/8] / [E, H, I/8], scales in the model dtype, uint8 zero points),
    gate and up each with their own rows, and dequantize to exactly the checkpoint's weights;
    the router stays in the model dtype."""
    from hotpath.ops.moe.reference import _expert_weight

    G = INT4_MOE_GROUP
    dense, routers = write_moe_with(tmp_path, int4_quantization_config(fmt, G), int4_tensors(fmt, G),
                                    INT4_MOE_EXPERTS)
    model = load(tmp_path)
    for i in range(LAYERS):
        mlp = model.model.layers[i].mlp
        assert isinstance(mlp.gate.method, UnquantizedLinearMethod)
        assert torch.equal(mlp.gate.weight, routers[f"model.layers.{i}.mlp.gate.weight"])
        experts = mlp.experts
        E, H, I = INT4_MOE_EXPERTS, HIDDEN, MOE_INTER
        assert experts.w13.dtype == experts.w2.dtype == torch.int32
        assert experts.w13.shape == (E, 2 * I, H // 8) and experts.w2.shape == (E, H, I // 8)
        assert experts.w13_scales.shape == experts.w13_zeros.shape == (E, 2 * I, H // G)
        assert experts.w2_scales.shape == experts.w2_zeros.shape == (E, H, I // G)
        assert experts.w13_scales.dtype == torch.float32 and experts.w13_zeros.dtype == torch.uint8
        for e in range(E):
            p = f"model.layers.{i}.mlp.experts.{e}"
            want13 = torch.cat([dense[f"{p}.gate_proj"], dense[f"{p}.up_proj"]])
            got13 = _expert_weight(experts.w13, experts.w13_scales, experts.w13_zeros, None, G, 2, e)
            got2 = _expert_weight(experts.w2, experts.w2_scales, experts.w2_zeros, None, G, 1, e)
            assert torch.equal(got13, want13)
            assert torch.equal(got2, dense[f"{p}.down_proj"])


def test_gptq_act_order_moe_experts_are_refused(tmp_path):
    G = INT4_MOE_GROUP
    write_moe_with(tmp_path, int4_quantization_config("gptq", G, desc_act=True),
                   int4_tensors("gptq", G, act_order=True), INT4_MOE_EXPERTS)
    with pytest.raises(ValueError, match="act-order .* not supported: hotpath's fused MoE kernels"):
        load(tmp_path)


def test_dummy_int4_experts_are_valid_words_scales_and_zeros(tmp_path):
    """load_format="dummy" fills int4 experts with random words, positive scales and zero
    points 0..15."""
    G = INT4_MOE_GROUP
    write_moe_with(tmp_path, int4_quantization_config("awq", G), int4_tensors("awq", G), INT4_MOE_EXPERTS)
    cfg = read_config(tmp_path)
    cfg.quantization = read_quant_config(tmp_path)
    model = load_model(cfg, tmp_path, "dummy", torch.device("cpu"), torch.bfloat16, 64)
    experts = model.model.layers[0].mlp.experts
    for name in ("w13", "w2"):
        words = getattr(experts, name)
        assert words.dtype == torch.int32 and len(words.unique()) > words.numel() // 2
        scales, zeros = getattr(experts, f"{name}_scales"), getattr(experts, f"{name}_zeros")
        assert scales.dtype == torch.bfloat16 and (scales > 0).all()
        assert zeros.dtype == torch.uint8 and int(zeros.max()) == 15 and int(zeros.min()) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_awq_model_matches_its_dense_copy(tmp_path):
    """An AWQ model through LLM on a GPU at every default but the dtype (CUDA graphs, the fused
    decode chain on the int4 GEMV up to 32 rows, the GEMM beyond): one prompt, 24 and 40 at once give
    the tokens and logprobs of the same model with its weights dequantized (float32: exact
    products in both)."""
    import gc

    from safetensors.torch import load_file

    from hotpath import LLM, SamplingParams

    tensors, qc = awq_linear_tensors(128)
    awq_dir, dense_dir = tmp_path / "awq", tmp_path / "dense"
    dense = write_checkpoint(awq_dir, qwen3_config(qc), tensors)
    stored = {k: v for k, v in load_file(awq_dir / "model.safetensors").items()
              if not k.endswith((".qweight", ".qzeros", ".scales"))}
    stored.update({f"{name}.weight": w for name, w in dense.items()})
    dense_dir.mkdir()
    save_file(stored, dense_dir / "model.safetensors")
    (dense_dir / "config.json").write_text(json.dumps(qwen3_config(None)))
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB, (int(n),), generator=g).tolist()
               for n in torch.randint(2, 30, (40,), generator=g)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1)
    runs = []
    for model_dir in (awq_dir, dense_dir):
        llm = LLM(str(model_dir), skip_tokenizer_init=True, dtype="float32")
        outs = [llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
                for batch in (prompts[:1], prompts[:24], prompts)]
        runs.append([o.outputs[0] for batch in outs for o in batch])
        del llm
        gc.collect()  # the first engine's memory back before the second sizes its KV cache
        torch.cuda.empty_cache()
    for got, want in zip(*runs):
        assert got.token_ids == want.token_ids
        lps = [[lp[t].logprob for lp, t in zip(o.logprobs, o.token_ids)] for o in (got, want)]
        assert max(abs(a - b) for a, b in zip(*lps)) < 1e-4
