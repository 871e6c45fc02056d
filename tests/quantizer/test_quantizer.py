"""`hotpath quantize`: the published layouts field by field, the output reloading through the
loaders, generation close to the unquantized model, and the algorithms' error against plain
round-to-nearest (AWQ's scale search, GPTQ's error compensation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from hotpath import LLM, SamplingParams
from hotpath.quantizer.awq import search_scale
from hotpath.quantizer.gptq import gptq_quantize
from hotpath.quantizer.int4_rtn import fake_quantize
from hotpath.quantizer.quantize import QuantizeOptions, quantize

G = 32
# hidden 128 and 128-row k/v parts: every fused fp8 block starts on a block
CONFIG = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=4, head_dim=32, vocab_size=256, max_position_embeddings=512,
              tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, initializer_range=0.1)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**CONFIG)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    path = tmp_path_factory.mktemp("source")
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def quantized(source, tmp_path_factory):
    cache = {}

    def get(method: str, **options) -> Path:
        key = (method, tuple(sorted(options.items())))
        if key not in cache:
            out = tmp_path_factory.mktemp(method) / "out"
            opts = dict(group_size=G, calibration="random", num_samples=8, seq_len=64)
            cache[key] = quantize(str(source), out, QuantizeOptions(method=method, **{**opts, **options}))
        return cache[key]

    return get


def tensors(path: Path) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    with safe_open(str(path / "model.safetensors"), framework="pt") as h:
        return {n: (h.get_slice(n).get_dtype(), tuple(h.get_slice(n).get_shape())) for n in h.keys()}


LINEARS = {"self_attn.q_proj": (128, 128), "self_attn.k_proj": (128, 128),
           "self_attn.v_proj": (128, 128), "self_attn.o_proj": (128, 128),
           "mlp.gate_proj": (256, 128), "mlp.up_proj": (256, 128), "mlp.down_proj": (128, 256)}


@pytest.mark.parametrize("method,expected", [
    ("fp8-block", lambda n, k: {"weight": ("F8_E4M3", (n, k)),
                                "weight_scale_inv": ("BF16", (-(-n // 128), -(-k // 128)))}),
    ("fp8-ptpc", lambda n, k: {"weight": ("F8_E4M3", (n, k)), "weight_scale": ("BF16", (n, 1))}),
    ("awq", lambda n, k: {"qweight": ("I32", (k, n // 8)), "qzeros": ("I32", (k // G, n // 8)),
                          "scales": ("F16", (k // G, n))}),
    ("gptq", lambda n, k: {"qweight": ("I32", (k // 8, n)), "qzeros": ("I32", (k // G, n // 8)),
                           "scales": ("F16", (k // G, n)), "g_idx": ("I32", (k,))}),
])
def test_layout_is_the_published_one(quantized, method, expected):
    out = quantized(method)
    found = tensors(out)
    plain_dtype = "BF16" if method.startswith("fp8") else "F16"
    for i in range(CONFIG["num_hidden_layers"]):
        for name, (n, k) in LINEARS.items():
            for suffix, (dtype, shape) in expected(n, k).items():
                assert found.pop(f"model.layers.{i}.{name}.{suffix}") == (dtype, shape), (name, suffix)
    assert found.pop("lm_head.weight") == (plain_dtype, (256, 128))
    assert found.pop("model.embed_tokens.weight") == (plain_dtype, (256, 128))
    assert all(dtype == plain_dtype and "norm" in n for n, (dtype, _) in found.items()), found
    config = json.loads((out / "config.json").read_text())
    qc = config["quantization_config"]
    assert config["torch_dtype"] == {"BF16": "bfloat16", "F16": "float16"}[plain_dtype]
    if method == "fp8-block":
        assert qc == {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                      "weight_block_size": [128, 128]}
    elif method == "fp8-ptpc":
        assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "float-quantized"
        assert qc["quantization_status"] == "compressed" and qc["ignore"] == ["lm_head"]
        scheme = qc["config_groups"]["group_0"]
        assert scheme["targets"] == ["Linear"]
        assert {k: scheme["weights"][k] for k in ("num_bits", "type", "strategy", "symmetric", "dynamic")} == \
            {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False}
        assert {k: scheme["input_activations"][k] for k in ("num_bits", "type", "strategy", "dynamic")} == \
            {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}
    elif method == "awq":
        assert qc == {"bits": 4, "group_size": G, "modules_to_not_convert": None, "quant_method": "awq",
                      "version": "gemm", "zero_point": True}
    else:
        assert {k: qc[k] for k in ("bits", "group_size", "desc_act", "sym", "quant_method",
                                   "checkpoint_format")} == \
            {"bits": 4, "group_size": G, "desc_act": False, "sym": True, "quant_method": "gptq",
             "checkpoint_format": "gptq"}


def _hotpath_weights(path: Path) -> dict[str, torch.Tensor]:
    """Each linear's weight as the loaded hotpath model runs it (dequantized), by module."""
    from hotpath.layers.linear import Linear
    from hotpath.layers.quant.detect import read_quant_config
    from hotpath.loader.model_loader import load_model
    from hotpath.models.registry import read_config
    from hotpath.ops.quant.reference import dequantize_fp8, dequantize_int4

    cfg = read_config(path)
    cfg.quantization = read_quant_config(path)
    model = load_model(cfg, path, "auto", torch.device("cpu"), torch.float32, 64)
    out = {}
    for name, m in model.named_modules():
        if not isinstance(m, Linear):
            continue
        if hasattr(m, "qweight"):
            out[name] = dequantize_int4(m.qweight, m.scales, m.qzeros, m.method.group_size, m.g_idx)
        elif m.weight.dtype == torch.float8_e4m3fn:
            scale = getattr(m, m.method.scale_name)
            out[name] = dequantize_fp8(m.weight, scale, m.method.block_size)
        else:
            out[name] = m.weight.float()
    return out


@pytest.mark.parametrize("method,options,max_error", [
    ("fp8-block", {}, 0.04), ("fp8-ptpc", {}, 0.04), ("gptq", {}, 0.15),
    ("gptq", {"desc_act": True}, 0.15), ("gptq", {"sym": False}, 0.15),
])
def test_output_reloads_close_to_the_source_weights(source, quantized, method, options, max_error):
    """Every linear reloads quantized; its weight within the format's rounding of the source's.
    (AWQ's weights are rescaled against their input norms, so AWQ is checked by what it
    generates, below.)"""
    original = _hotpath_weights(source)
    got = _hotpath_weights(quantized(method, **options))
    assert got.keys() == original.keys()
    for name, w in original.items():
        err = (got[name] - w).norm() / w.norm()
        assert err < max_error, (name, float(err))


def _llm(path: Path, quantization: str | None = None) -> LLM:
    return LLM(str(path), skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=256,
               quantization=quantization)


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, 256, (n,), generator=g).tolist() for n in (4, 9, 16, 23, 31, 40)]


def _greedy(llm: LLM, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def _teacher_forced_agreement(base: LLM, quantized: LLM) -> float:
    """The fraction of the base model's greedy tokens (12 after each of 6 random prompts) that
    the quantized model also picks, fed the same prefix each time."""
    prompts = _prompts()
    prefixes, expected = [], []
    for prompt, tokens in zip(prompts, _greedy(base, prompts, 12)):
        for i, token in enumerate(tokens):
            prefixes.append(prompt + tokens[:i])
            expected.append(token)
    got = [t[0] for t in _greedy(quantized, prefixes, 1)]
    return sum(a == b for a, b in zip(got, expected)) / len(expected)


# Measured on this tiny random model (CPU, fp32, 72 positions; random weights give small margins
# between the top logits): fp8-block 0.81, fp8-ptpc 0.81, online fp8 0.75, awq 0.54, gptq 0.47;
# chance is 1/256. The bounds sit a little below.
@pytest.mark.parametrize("method,online,min_agreement", [
    ("fp8-block", None, 0.7), ("fp8-ptpc", None, 0.7), (None, "fp8", 0.65),
    ("awq", None, 0.4), ("gptq", None, 0.4),
])
def test_quantized_model_generates_close_to_the_unquantized(source, quantized, method, online,
                                                           min_agreement):
    agreement = _teacher_forced_agreement(
        _llm(source), _llm(quantized(method) if method else source, online))
    print(f"{method or online}: teacher-forced greedy agreement {agreement:.3f}")
    assert agreement >= min_agreement


def test_awq_scale_search_beats_round_to_nearest_on_outlier_channels():
    """Activations with a few large channels (as real LLM activations have): the searched scales
    give a lower output error than plain rounding."""
    g = torch.Generator().manual_seed(0)
    K, N, T = 256, 192, 1024
    channel_scale = torch.ones(K)
    channel_scale[torch.randperm(K, generator=g)[:8]] = 30.0
    x = torch.randn(T, K, generator=g) * channel_scale
    lin = torch.nn.Linear(K, N, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(N, K, generator=g) * 0.05)
    ref = x @ lin.weight.T
    rtn = ((x @ fake_quantize(lin.weight, 64).T - ref) ** 2).mean()
    s = search_scale(x.abs().mean(0), x, [lin], 64)
    awq = ((x @ (fake_quantize(lin.weight * s, 64) / s).T - ref) ** 2).mean()
    assert awq < 0.8 * rtn, (float(awq), float(rtn))


@pytest.mark.parametrize("desc_act", [False, True])
def test_gptq_error_compensation_beats_round_to_nearest(desc_act):
    g = torch.Generator().manual_seed(0)
    K, N, T = 128, 96, 2048
    mix = torch.randn(K, K, generator=g) / K**0.5 + torch.eye(K)  # correlated inputs
    x = torch.randn(T, K, generator=g) @ mix * (torch.rand(K, generator=g) * 3 + 0.1)
    w = torch.randn(N, K, generator=g) * 0.05
    h = 2 * x.double().T @ x.double() / T
    q, zeros, scales, g_idx, deq = gptq_quantize(w, h, 32, desc_act=desc_act, sym=False)
    # the returned parts are the dequantized weight, and the groups hold 32 columns each
    assert torch.equal(deq, (q - zeros[:, g_idx.long()]).float() * scales[:, g_idx.long()])
    assert torch.equal(torch.bincount(g_idx.long()), torch.full((K // 32,), 32))
    assert (not desc_act) == torch.equal(g_idx.long(), torch.arange(K) // 32)
    err = ((x @ deq.T - x @ w.T) ** 2).mean()
    rtn = ((x @ fake_quantize(w, 32).T - x @ w.T) ** 2).mean()
    assert err < 0.8 * rtn, (float(err), float(rtn))


def _correlated_inputs(T: int, K: int, seed: int) -> torch.Tensor:
    """Rows from one fixed distribution (a fixed mixing matrix and channel scales, the seed only
    drawing the rows): calibration and held-out sets of the same inputs."""
    g = torch.Generator().manual_seed(0)
    mix = torch.randn(K, K, generator=g) / K**0.5 + torch.eye(K)
    channel = torch.rand(K, generator=g) * 3 + 0.1
    return torch.randn(T, K, generator=torch.Generator().manual_seed(seed)) @ mix * channel


def _gptq_unblocked(w: torch.Tensor, h: torch.Tensor, G: int, desc_act: bool, sym: bool,
                    damp: float = 0.01) -> torch.Tensor:
    """GPTQ as the paper's algorithm states it, written independently of hotpath's: in float64,
    one column at a time, every later column updated right after each is rounded (no blocks, no
    lazy updates); a group's scale and zero point from its columns as updated when it starts."""
    from hotpath.quantizer.gptq import _sym_params
    from hotpath.quantizer.int4_rtn import group_params, quantize_with

    W, H, K = w.double().clone(), h.double().clone(), w.shape[1]
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    perm = torch.argsort(torch.diag(H), descending=True) if desc_act else torch.arange(K)
    W, H = W[:, perm], H[perm][:, perm]
    H += damp * torch.diag(H).mean() * torch.eye(K, dtype=H.dtype)
    U = torch.linalg.cholesky(torch.linalg.inv(H), upper=True)  # inverse Hessian's upper factor
    out = torch.zeros_like(W)
    for j in range(K):
        if j % G == 0:
            scale, zero = (_sym_params if sym else group_params)(W[:, j:j + G].float())
            scale, zero = scale[:, 0].double(), zero[:, 0].double()
        out[:, j] = (quantize_with(W[:, j], scale, zero) - zero) * scale
        err = (W[:, j] - out[:, j]) / U[j, j]
        W[:, j:] -= err[:, None] * U[j, j:][None, :]
    return out[:, torch.argsort(perm)].float()


@pytest.mark.parametrize("desc_act", [False, True])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("group_size", [32, 128])
def test_gptq_is_the_unblocked_algorithm(desc_act, sym, group_size):
    """hotpath's blocked GPTQ (blocks of 128, lazy updates, Cholesky of the inverse) against the
    column-at-a-time algorithm: three blocks, a dead input, fewer calibration rows than inputs
    (a rank-deficient Hessian, as down_proj's from 4,096 tokens). Float32 against float64 rounds
    an occasional weight the other way, and the later columns then compensate differently."""
    K, N = 384, 64
    x = _correlated_inputs(300, K, seed=1)
    x[:, 5] = 0
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(2)) * 0.05
    h = 2 * x.double().T @ x.double() / x.shape[0]
    deq = gptq_quantize(w, h, group_size, desc_act=desc_act, sym=sym)[4]
    ref = _gptq_unblocked(w, h, group_size, desc_act, sym)
    assert (deq != ref).float().mean() < 0.02
    assert torch.all(deq[:, 5] == 0) and torch.all(ref[:, 5] == 0)  # the dead input's column
    err, ref_err = ((x @ (deq - w).T).norm() for deq in (deq, ref))
    assert abs(err / ref_err - 1) < 0.02, (float(err), float(ref_err))


@pytest.mark.parametrize("sym", [True, False])
def test_gptq_beats_round_to_nearest_on_held_out_inputs(sym):
    """The Hessian from one set of rows, the error measured on fresh rows of the same inputs:
    GPTQ's layer output error well below plain rounding's on the same grid (symmetric groups,
    GPTQ's default, or asymmetric ones, the rtn-int4 row of benchmarks/quant_accuracy.py).
    Measured: 0.80 of rounding's for both. (On a real model calibrated on code and measured on
    English text, GPTQ can lose to rounding: its compensation fits the calibration's inputs;
    see docs/benchmarks.md, "Quantization accuracy".)"""
    from hotpath.quantizer.gptq import _sym_params
    from hotpath.quantizer.int4_rtn import quantize_with

    K, N, G = 256, 128, 64
    calib, held_out = _correlated_inputs(4096, K, seed=1), _correlated_inputs(4096, K, seed=2)
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(3)) * 0.05
    h = 2 * calib.double().T @ calib.double() / calib.shape[0]
    deq = gptq_quantize(w, h, G, sym=sym)[4]
    if sym:
        groups = w.reshape(N, K // G, G)
        scale, zero = _sym_params(groups)
        rtn = ((quantize_with(groups, scale, zero) - zero) * scale).reshape(N, K)
    else:
        rtn = fake_quantize(w, G)
    err, rtn_err = ((held_out @ (d - w).T).norm() for d in (deq, rtn))
    assert err < 0.85 * rtn_err, (float(err), float(rtn_err))


@pytest.mark.parametrize("desc_act", [False, True])
@pytest.mark.parametrize("sym", [True, False])
def test_gptq_checkpoint_dequantizes_to_the_quantizer_result(desc_act, sym):
    """The packed GPTQ v1 tensors, read by the loader into the kernels' layout, dequantize to
    exactly the weight the quantizer computed (the weight the later layers calibrated with)."""
    from hotpath.layers.quant.gptq import gptq_to_int4
    from hotpath.ops.quant.reference import dequantize_int4
    from hotpath.quantizer import formats

    K, N = 256, 64
    x = _correlated_inputs(1024, K, seed=1)
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(2)) * 0.05
    q, zeros, scales, g_idx, deq = gptq_quantize(w, 2 * x.double().T @ x.double() / 1024, G,
                                                 desc_act=desc_act, sym=sym)
    t = formats.gptq_tensors(q, zeros, scales, g_idx)
    qweight, s, z, _, stored_g_idx = gptq_to_int4(t["qweight"], t["qzeros"], t["scales"],
                                                  t["g_idx"], G, True, torch.float32)
    assert torch.equal(dequantize_int4(qweight, s, z, G, stored_g_idx), deq)


def test_bad_options_are_refused(source, tmp_path):
    with pytest.raises(ValueError, match="unknown method"):
        QuantizeOptions(method="int8")
    with pytest.raises(ValueError, match="group_size"):
        QuantizeOptions(method="awq", group_size=0)
    with pytest.raises(ValueError, match="cannot quantize"):  # 128 inputs in groups of 96
        quantize(str(source), tmp_path / "o", QuantizeOptions(method="awq", group_size=96))
    assert not (tmp_path / "o").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        quantize(str(source), tmp_path / "full", QuantizeOptions(method="fp8-block"))


@pytest.mark.parametrize("method,options", [("awq", {"scale_search": False, "clip": False}),
                                            ("gptq", {})])
def test_int4_keeps_the_biases_and_rtn_is_round_to_nearest(tmp_path, method, options):
    """Qwen2's q/k/v projections have biases: the int4 checkpoint keeps them beside qweight
    (they were dropped once, and Qwen2.5 checkpoints did not load). AWQ without its searches
    is plain round to nearest: every weight reloads as the source's, rounded."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = {k: v for k, v in CONFIG.items() if k != "head_dim"} | {"num_hidden_layers": 1}
    hf = Qwen2ForCausalLM(Qwen2Config(**cfg)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("proj.bias"):
                p.copy_(torch.randn_like(p))
    hf.save_pretrained(tmp_path / "source")
    out = quantize(str(tmp_path / "source"), tmp_path / "out",
                   QuantizeOptions(method=method, group_size=G, calibration="random", num_samples=4,
                                   seq_len=32, **options))
    with safe_open(str(out / "model.safetensors"), framework="pt") as h:
        for part in "qkv":
            bias = h.get_tensor(f"model.layers.0.self_attn.{part}_proj.bias")
            source = hf.get_parameter(f"model.layers.0.self_attn.{part}_proj.bias")
            assert torch.equal(bias, source.detach().to(torch.float16)), part
    got = _hotpath_weights(out)  # loads: no weight is missing
    if method == "awq":
        source = _hotpath_weights(tmp_path / "source")
        for name, w in source.items():
            assert torch.equal(got[name], fake_quantize(w, G)), name
