import json
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from hotpath import assets
from hotpath.loader import gguf as gguf_loader
from hotpath.loader.gguf import (
    CONVERTER_VERSION,
    GGUF_LINK,
    SHARD_BYTES,
    gguf_to_hf_dir,
    hf_tensor_name,
    open_gguf,
    unpermute_qk,
    weights_dir,
)

EMBED = np.arange(64, dtype=np.float32).reshape(8, 8)
NORM = np.ones(8, dtype=np.float32)
# Q8_0 blocks of 32: values a bf16 cannot hold exactly, so the stored dtype shows in the bits.
MLP = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)


def write_small_gguf(path: Path) -> None:
    """A tiny but valid GGUF (two f32 tensors and a Q8_0 one) made with llama.cpp's own writer."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", EMBED)
    writer.add_tensor("output_norm.weight", NORM)
    writer.add_tensor("blk.0.ffn_up.weight", gguf.quantize(MLP, gguf.GGMLQuantizationType.Q8_0),
                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture
def small_gguf(tmp_path) -> Path:
    path = tmp_path / "small.gguf"
    write_small_gguf(path)
    return path


@pytest.fixture
def conversions(monkeypatch) -> list[Path]:
    """Replaces transformers' config and tokenizer parsing (the tiny GGUF has neither) with a stub
    config, and records every conversion."""
    made = []

    def fake_config_and_tokenizer(gguf_path: Path, out: Path) -> None:
        made.append(gguf_path)
        (out / "config.json").write_text(json.dumps({"num_attention_heads": 2}))

    monkeypatch.setattr(gguf_loader, "_write_config_and_tokenizer", fake_config_and_tokenizer)
    return made


def load_weights(model_dir: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(weights_dir(model_dir, dtype).glob("*.safetensors"))
    return {k: v for f in files for k, v in load_file(f).items()}


def test_small_gguf_opens(small_gguf):
    import gguf

    parsed = open_gguf(small_gguf)
    assert parsed.metadata["general.architecture"] == "llama"
    assert parsed.metadata["llama.block_count"] == 1
    reader = gguf.GGUFReader(small_gguf)  # llama.cpp's own parser agrees on the tensor table
    assert [(t.name, t.shape, t.qtype, t.offset, t.nbytes) for t in parsed.tensors] == [
        (t.name, tuple(int(d) for d in reversed(t.shape)), t.tensor_type, t.data_offset, int(t.n_bytes))
        for t in reader.tensors
    ]


def test_same_content_at_two_paths_converts_once(small_gguf, tmp_path, conversions, monkeypatch):
    cache = tmp_path / "cache"
    out = gguf_to_hf_dir(small_gguf, cache_dir=cache)
    # A copy under another name, folder and mtime: a key from the path, name or mtime would miss.
    copy = tmp_path / "elsewhere" / "renamed.gguf"
    copy.parent.mkdir()
    shutil.copyfile(small_gguf, copy)
    os.utime(copy, ns=(1, 1))
    assert gguf_to_hf_dir(copy, cache_dir=cache) == out
    assert conversions == [small_gguf]
    assert os.readlink(out / GGUF_LINK) == str(copy)  # the weights come from the path seen last
    assert [p.name for p in (cache / "hf").iterdir()] == [out.name]

    def no_hash(path):
        raise AssertionError(f"hashed {path} again")

    monkeypatch.setattr(assets, "_sha256_file", no_hash)  # each path was hashed once, and only once
    assert gguf_to_hf_dir(copy, cache_dir=cache) == out
    assert gguf_to_hf_dir(small_gguf, cache_dir=cache) == out
    assert os.readlink(out / GGUF_LINK) == str(small_gguf)


def test_different_content_converts_again(small_gguf, tmp_path, conversions):
    other = tmp_path / "other.gguf"
    other.write_bytes(small_gguf.read_bytes() + b"\0" * 32)  # trailing padding: still a valid GGUF
    assert gguf_to_hf_dir(small_gguf, cache_dir=tmp_path) != gguf_to_hf_dir(other, cache_dir=tmp_path)
    assert conversions == [small_gguf, other]


def test_weights_are_stored_in_the_run_dtype(small_gguf, tmp_path, conversions):
    import gguf

    out = gguf_to_hf_dir(small_gguf, cache_dir=tmp_path)
    assert not any(out.glob("**/*.safetensors"))  # nothing until a load says which dtype
    mlp = gguf.dequantize(gguf.quantize(MLP, gguf.GGMLQuantizationType.Q8_0),
                          gguf.GGMLQuantizationType.Q8_0).reshape(MLP.shape)
    expected = {"model.embed_tokens.weight": EMBED, "model.norm.weight": NORM,
                "model.layers.0.mlp.up_proj.weight": mlp}
    bf16 = load_weights(out, torch.bfloat16)
    fp32 = load_weights(out, torch.float32)
    assert set(fp32) == set(bf16) == set(expected)
    for name, ref in expected.items():
        assert fp32[name].dtype == torch.float32 and torch.equal(fp32[name], torch.from_numpy(ref))
        # bf16: exactly what a bf16 model loading the float32 copy would hold
        assert bf16[name].dtype == torch.bfloat16 and torch.equal(bf16[name], fp32[name].bfloat16())
    assert not torch.equal(bf16["model.layers.0.mlp.up_proj.weight"].float(),
                           fp32["model.layers.0.mlp.up_proj.weight"])

    def size(dtype: torch.dtype) -> int:
        return sum(f.stat().st_size for f in weights_dir(out, dtype).glob("*.safetensors"))

    n = EMBED.size + NORM.size + MLP.size
    assert 4 * n < size(torch.float32) < 4 * n + 1024
    assert 2 * n < size(torch.bfloat16) < 2 * n + 1024
    assert weights_dir(out, torch.float32) == out / "weights-float32"  # made once, then reused
    assert weights_dir(out, torch.bfloat16) == out / "weights-bfloat16"
    assert weights_dir(out, torch.float16) == out / "weights-float32"  # no third copy: fp32 serves
    assert sorted(p.name for p in out.glob("weights-*")) == ["weights-bfloat16", "weights-float32"]
    assert conversions == [small_gguf]


def test_concurrent_conversions_leave_one_complete_dir(small_gguf, tmp_path, conversions, monkeypatch):
    # Both threads are inside the conversion before either renames its result into place.
    barrier = threading.Barrier(2)
    convert = gguf_loader._write_config_and_tokenizer

    def slow(gguf_path: Path, out: Path) -> None:
        convert(gguf_path, out)
        barrier.wait(timeout=30)

    monkeypatch.setattr(gguf_loader, "_write_config_and_tokenizer", slow)
    results, errors = [], []

    def run():
        try:
            out = gguf_to_hf_dir(small_gguf, cache_dir=tmp_path)
            results.append((out, load_weights(out, torch.float32)))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(conversions) == 2 and results[0][0] == results[1][0]
    out = results[0][0]
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]  # no temp dirs left
    assert torch.equal(results[0][1]["model.embed_tokens.weight"], torch.from_numpy(EMBED))
    assert not [p for p in out.iterdir() if ".tmp-" in p.name or p.name.startswith(".")]


def test_older_converter_versions_are_removed(small_gguf, tmp_path, conversions):
    hf = tmp_path / "hf"
    # A v1 conversion: keyed by the GGUF's name and mtime, a float32 copy of the weights.
    old = hf / "small-0123456789abcdef"
    old.mkdir(parents=True)
    (old / "hotpath_source.json").write_text(json.dumps({"gguf": str(small_gguf), "converter_version": 1}))
    (old / "model.safetensors").write_bytes(b"x" * 100)
    newer = hf / f"0123456789abcdef-v{CONVERTER_VERSION + 1}"
    newer.mkdir()
    (newer / "hotpath_source.json").write_text(json.dumps({"converter_version": CONVERTER_VERSION + 1}))
    foreign = hf / "not-ours"
    foreign.mkdir()
    out = gguf_to_hf_dir(small_gguf, cache_dir=tmp_path)
    assert sorted(p.name for p in hf.iterdir()) == sorted([out.name, newer.name, foreign.name])


def test_weights_from_a_gone_gguf(small_gguf, tmp_path, conversions):
    out = gguf_to_hf_dir(small_gguf, cache_dir=tmp_path / "cache")
    load_weights(out, torch.bfloat16)
    small_gguf.unlink()
    assert load_weights(out, torch.bfloat16)  # made already: the GGUF is no longer needed
    with pytest.raises(FileNotFoundError, match="small.gguf, is gone"):
        weights_dir(out, torch.float32)


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        gguf_to_hf_dir(missing, cache_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        open_gguf(missing)


@pytest.mark.parametrize("content", [b"", b"GGU", b"PK\x03\x04 this is a zip, not a gguf"])
def test_not_gguf_magic(tmp_path, content):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    with pytest.raises(ValueError, match=r"bad\.gguf is not a valid GGUF file.*magic"):
        gguf_to_hf_dir(bad, cache_dir=tmp_path)
    assert not (tmp_path / "hf").exists() or not any((tmp_path / "hf").iterdir())


@pytest.mark.parametrize("keep", [10, 100, 0.5, -4])  # bytes kept: in header, in kv data, in tensor data
def test_truncated_file(small_gguf, tmp_path, keep):
    data = small_gguf.read_bytes()
    n = int(len(data) * keep) if isinstance(keep, float) else keep % len(data)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:n])
    with pytest.raises(ValueError, match=r"cut\.gguf is not a valid GGUF file"):
        open_gguf(cut)
    with pytest.raises(ValueError, match=r"cut\.gguf is not a valid GGUF file"):
        gguf_to_hf_dir(cut, cache_dir=tmp_path)


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The row permutation llama.cpp's converter applies to llama q/k projections."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("shape,n_head", [((48, 5), 3), ((64, 7), 4), ((24,), 2)])
def test_unpermute_inverts_llama_cpp_permute(shape, n_head):
    w = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    permuted = llama_cpp_permute(w, n_head)
    assert not np.array_equal(permuted, w)
    assert np.array_equal(unpermute_qk(permuted, n_head), w)


def test_tensor_names():
    assert hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_tensor_name("output.weight") == "lm_head.weight"
    assert hf_tensor_name("output_norm.weight") == "model.norm.weight"
    assert hf_tensor_name("blk.11.attn_q.bias") == "model.layers.11.self_attn.q_proj.bias"
    assert hf_tensor_name("blk.0.attn_output.weight") == "model.layers.0.self_attn.o_proj.weight"
    assert hf_tensor_name("blk.2.ffn_norm.weight") == "model.layers.2.post_attention_layernorm.weight"
    assert hf_tensor_name("blk.2.ffn_down.weight") == "model.layers.2.mlp.down_proj.weight"
    assert hf_tensor_name("rope_freqs.weight") is None
    with pytest.raises(ValueError, match="blk.0.ssm_a"):
        hf_tensor_name("blk.0.ssm_a")


# --- real models: every converted tensor must equal transformers' own GGUF loading -------------

TEXT = "Hello, world! def f(x): return x"


@pytest.fixture(scope="module")
def convert_cache(tmp_path_factory) -> Path:
    # A fresh cache so the test exercises the conversion itself, not an earlier run's output.
    return tmp_path_factory.mktemp("hotpath-cache")


@pytest.mark.real_models
@pytest.mark.parametrize("name,tied", [("smollm2-135m", True), ("qwen2.5-coder-0.5b", False)])
def test_real_model_matches_transformers(name, tied, convert_cache, hf_gguf_models):
    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer

    from hotpath.assets import KNOWN_MODELS, fetch_model

    gguf_path = fetch_model(name)
    # A v1 conversion of the same file (float32, keyed by name and mtime) is removed by the next one.
    stale = convert_cache / "hf" / (gguf_path.stem + "-0000000000000000")
    stale.mkdir(parents=True)
    (stale / "hotpath_source.json").write_text(
        json.dumps({"gguf": str(gguf_path.resolve()), "converter_version": 1}))
    out = gguf_to_hf_dir(gguf_path, cache_dir=convert_cache)
    assert out.parent == stale.parent and not stale.exists()
    assert out.name == f"{KNOWN_MODELS[name].sha256[:16]}-v{CONVERTER_VERSION}"
    start = time.perf_counter()
    assert gguf_to_hf_dir(gguf_path, cache_dir=convert_cache) == out
    assert time.perf_counter() - start < 1.0  # cached, hash included: no second conversion

    src, file = gguf_path.parent, gguf_path.name
    # transformers' model of the GGUF (AutoModelForCausalLM.from_pretrained(src, gguf_file=file)),
    # shared with test_real_gguf; its config is AutoConfig.from_pretrained(src, gguf_file=file)'s
    ref_model = hf_gguf_models.get(name)
    ref_config = ref_model.config
    config = AutoConfig.from_pretrained(out)
    assert config.tie_word_embeddings is tied
    for key in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "intermediate_size", "vocab_size", "rms_norm_eps",
                "rope_parameters", "max_position_embeddings", "eos_token_id", "bos_token_id"):
        assert getattr(config, key) == getattr(ref_config, key), key

    ref = ref_model.state_dict()
    expected_keys = set(ref) - ({"lm_head.weight"} if tied else set())
    # the GPU's and the CPU's default: both for the small model; the default model (what it adds is
    # its layout: an untied head, Qwen2's biases) at the CPU's, the one its later tests load
    for dtype in (torch.bfloat16, torch.float32) if tied else (torch.float32,):
        weights = weights_dir(out, dtype)
        index = json.loads((weights / "model.safetensors.index.json").read_text())
        assert set(index["weight_map"]) == expected_keys
        assert index["metadata"]["total_size"] == sum(ref[k].numel() for k in expected_keys) * dtype.itemsize
        seen = set()
        for shard in sorted(set(index["weight_map"].values())):
            path = weights / shard
            with safe_open(path, "pt") as f:
                keys = list(f.keys())
                assert len(keys) == 1 or path.stat().st_size <= SHARD_BYTES + (1 << 20)
                for key in keys:
                    mine, want = f.get_tensor(key), ref[key].to(dtype)
                    assert mine.dtype == dtype, key
                    assert mine.shape == want.shape, key
                    assert torch.equal(mine, want), f"{key}: max abs diff {(mine - want).abs().max()}"
                    seen.add(key)
        assert seen == expected_keys

    ref_tok = AutoTokenizer.from_pretrained(src, gguf_file=file)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.encode(TEXT) == ref_tok.encode(TEXT)
    assert len(tok.encode(TEXT)) > 5
    assert tok.chat_template and tok.chat_template == ref_tok.chat_template
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                     add_generation_prompt=True)
    assert "<|im_start|>user" in prompt and prompt.rstrip().endswith("assistant")
