"""GGUF -> HF-style model directory (config.json, tokenizer files, float32 safetensors shards).

The rest of hotpath loads models from HF-style directories; a GGUF file is converted once and the
result is cached. Config and tokenizer come from transformers' own GGUF parsing, so they are exactly
what the HF reference sees. Weights are dequantized one tensor at a time and stored as float32, so a
converted model matches transformers' GGUF-loaded fp32 state dict bit for bit.

Cache layout: `<cache root>/hf/<gguf stem>-<key>/` where key hashes the GGUF's file name, size and
mtime plus CONVERTER_VERSION; the directory appears (atomic rename) only once it is complete.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

GGUF_MAGIC = b"GGUF"
# Bump when the output of the conversion changes, so stale cached dirs are not reused.
CONVERTER_VERSION = 1
SHARD_BYTES = 1 << 30  # host memory holds at most one shard of weights while converting

# llama.cpp's converter permutes q/k rows (for its RoPE layout) only for these architectures.
_PERMUTED_ARCHS = {"llama"}
# Tensors llama.cpp adds that have no HF parameter (HF recomputes them from the config).
_SKIPPED = {"rope_freqs.weight"}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",  # present only when the lm head is untied
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",  # qwen3
    "attn_k_norm": "self_attn.k_norm",  # qwen3
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _check_magic(path: Path) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ValueError(f"{path} is not a valid GGUF file: magic is {magic!r}, expected {GGUF_MAGIC!r}")


def open_gguf(path: str | Path):
    """A `gguf.GGUFReader` for `path`, with clear errors for missing, foreign or truncated files."""
    from gguf import GGUFReader

    path = Path(path)
    _check_magic(path)
    try:
        reader = GGUFReader(path)
    except Exception as e:  # the reader's own errors (numpy reshape/view) do not name the file
        raise ValueError(f"{path} is not a valid GGUF file (truncated or corrupt?): {e}") from e
    size = path.stat().st_size
    end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    if end > size:
        raise ValueError(f"{path} is not a valid GGUF file: truncated, tensor data needs {end} bytes, "
                         f"file has {size}")
    return reader


def hf_tensor_name(gguf_name: str) -> str | None:
    """HF parameter name for a GGUF tensor name; None for tensors HF does not store."""
    if gguf_name in _SKIPPED:
        return None
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES and parts[3] in ("weight", "bias"):
        return f"model.layers.{int(parts[1])}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    raise ValueError(f"unsupported GGUF tensor {gguf_name!r}")


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Invert llama.cpp's `w.reshape(n_head, 2, rows//n_head//2, ...).swapaxes(1, 2)` row permutation.

    llama.cpp interleaves the two rotary halves of each head; HF keeps them as two contiguous halves.
    """
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _cache_key(path: Path) -> str:
    st = path.stat()
    ident = f"{path.name}|{st.st_size}|{st.st_mtime_ns}|v{CONVERTER_VERSION}"
    return f"{path.stem}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}"


def gguf_to_hf_dir(gguf_path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Convert a GGUF file into a cached HF-style model directory and return its path.

    `cache_dir` is the cache root (default: hotpath's, see hotpath.assets); a second call for the same
    file returns the cached directory at once.
    """
    from hotpath.assets import default_cache_dir

    gguf_path = Path(gguf_path).resolve()
    _check_magic(gguf_path)
    root = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "hf"
    out = root / _cache_key(gguf_path)
    if (out / "config.json").is_file():
        return out  # before parsing the GGUF: the reader alone takes seconds on a 150k vocab
    reader = open_gguf(gguf_path)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=root))
    try:
        config = _write_config_and_tokenizer(gguf_path, tmp)
        _write_weights(reader, config, tmp)
        (tmp / "hotpath_source.json").write_text(json.dumps(
            {"gguf": str(gguf_path), "size": gguf_path.stat().st_size,
             "converter_version": CONVERTER_VERSION}, indent=2) + "\n")
        # mkdtemp and safetensors create owner-only entries; the cache is ordinary readable data.
        for f in tmp.iterdir():
            f.chmod(0o644)
        tmp.chmod(0o755)
        try:
            os.rename(tmp, out)
        except OSError:
            if not (out / "config.json").is_file():  # not a concurrent converter winning the race
                raise
            shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _remove_stale(out, gguf_path)
    return out


def _remove_stale(out: Path, gguf_path: Path) -> None:
    """Drop earlier conversions of the same file (re-fetched, or older CONVERTER_VERSION): GBs each."""
    for old in out.parent.glob(f"{glob.escape(gguf_path.stem)}-*"):
        source = old / "hotpath_source.json"
        if old != out and ".tmp-" not in old.name and source.is_file():
            if json.loads(source.read_text()).get("gguf") == str(gguf_path):
                shutil.rmtree(old, ignore_errors=True)


def _write_config_and_tokenizer(gguf_path: Path, out: Path):
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    src, name = gguf_path.parent, gguf_path.name
    config = AutoConfig.from_pretrained(src, gguf_file=name)
    # A model saved by HF records its class; the GGUF config alone does not.
    if not getattr(config, "architectures", None) and config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)

    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
    tokenizer.save_pretrained(out)
    # The chat template lives in GGUF metadata; make sure it made it through the save.
    if tokenizer.chat_template is not None:
        reloaded = AutoTokenizer.from_pretrained(out)
        if reloaded.chat_template != tokenizer.chat_template:
            raise RuntimeError(f"chat template of {gguf_path} was lost converting its tokenizer")
    return config


def _write_weights(reader, config, out: Path) -> None:
    import torch
    from gguf import dequantize
    from safetensors.torch import save_file
    from tqdm import tqdm

    arch = str(reader.fields["general.architecture"].contents())
    n_head = config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_head

    # Plan shards from the header (element counts) so file names carry N before any data is read.
    tensors = [t for t in reader.tensors if hf_tensor_name(t.name) is not None]
    shard_of, shard, used = [], 0, 0
    for t in tensors:
        nbytes = int(t.n_elements) * 4
        if used and used + nbytes > SHARD_BYTES:
            shard, used = shard + 1, 0
        shard_of.append(shard)
        used += nbytes
    n_shards = shard + 1

    weight_map: dict[str, str] = {}
    total = 0
    current: dict[str, torch.Tensor] = {}
    for i, t in enumerate(tqdm(tensors, desc=f"converting {arch} GGUF", unit="tensor")):
        name = hf_tensor_name(t.name)
        # GGUF lists dims fastest-first; numpy/torch (and HF) order is the reverse.
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(
            tuple(int(d) for d in reversed(t.shape)))
        if arch in _PERMUTED_ARCHS and t.name.endswith(("attn_q.weight", "attn_q.bias")):
            w = unpermute_qk(w, n_head)
        elif arch in _PERMUTED_ARCHS and t.name.endswith(("attn_k.weight", "attn_k.bias")):
            w = unpermute_qk(w, n_kv)
        if not w.flags.writeable or not w.flags.c_contiguous:  # F32 tensors are views of the mmap
            w = np.array(w, copy=True, order="C")
        current[name] = torch.from_numpy(w)
        total += w.nbytes
        file = f"model-{shard_of[i] + 1:05d}-of-{n_shards:05d}.safetensors"
        weight_map[name] = file
        if i + 1 == len(tensors) or shard_of[i + 1] != shard_of[i]:
            save_file(current, out / file, metadata={"format": "pt"})
            current = {}
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
