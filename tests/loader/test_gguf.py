import json
import time
from pathlib import Path

import numpy as np
import pytest

from hotpath.loader.gguf import SHARD_BYTES, gguf_to_hf_dir, hf_tensor_name, open_gguf, unpermute_qk


def write_small_gguf(path: Path) -> None:
    """A tiny but valid GGUF (two f32 tensors) made with llama.cpp's own writer."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.arange(64, dtype=np.float32).reshape(8, 8))
    writer.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture
def small_gguf(tmp_path) -> Path:
    path = tmp_path / "small.gguf"
    write_small_gguf(path)
    return path


def test_small_gguf_opens(small_gguf):
    reader = open_gguf(small_gguf)
    assert [t.name for t in reader.tensors] == ["token_embd.weight", "output_norm.weight"]


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
def test_real_model_matches_transformers(name, tied, convert_cache):
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from hotpath.assets import fetch_model

    gguf_path = fetch_model(name)
    # A stale conversion of the same file (e.g. before a re-fetch) is removed by the next conversion.
    stale = convert_cache / "hf" / (gguf_path.stem + "-0000000000000000")
    stale.mkdir(parents=True)
    (stale / "hotpath_source.json").write_text(json.dumps({"gguf": str(gguf_path.resolve())}))
    out = gguf_to_hf_dir(gguf_path, cache_dir=convert_cache)
    assert out.parent == stale.parent and not stale.exists()
    start = time.perf_counter()
    assert gguf_to_hf_dir(gguf_path, cache_dir=convert_cache) == out
    assert time.perf_counter() - start < 1.0  # cached: no second conversion

    src, file = gguf_path.parent, gguf_path.name
    ref_config = AutoConfig.from_pretrained(src, gguf_file=file)
    config = AutoConfig.from_pretrained(out)
    assert config.tie_word_embeddings is tied
    for key in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "intermediate_size", "vocab_size", "rms_norm_eps",
                "rope_parameters", "max_position_embeddings", "eos_token_id", "bos_token_id"):
        assert getattr(config, key) == getattr(ref_config, key), key

    ref = AutoModelForCausalLM.from_pretrained(src, gguf_file=file, dtype=torch.float32).state_dict()
    index = json.loads((out / "model.safetensors.index.json").read_text())
    expected_keys = set(ref) - ({"lm_head.weight"} if tied else set())
    assert set(index["weight_map"]) == expected_keys
    seen = set()
    for shard in sorted(set(index["weight_map"].values())):
        path = out / shard
        with safe_open(path, "pt") as f:
            keys = list(f.keys())
            assert len(keys) == 1 or path.stat().st_size <= SHARD_BYTES + (1 << 20)
            for key in keys:
                mine = f.get_tensor(key)
                assert mine.dtype == torch.float32, key
                assert mine.shape == ref[key].shape, key
                assert torch.equal(mine, ref[key]), f"{key}: max abs diff {(mine - ref[key]).abs().max()}"
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
