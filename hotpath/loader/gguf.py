"""GGUF -> HF-style model directory: config.json, tokenizer files and safetensors in the run dtype.

The rest of hotpath loads models from HF-style directories, so a GGUF is converted once per content
(its sha256: the same file at two paths is converted once) and the result is cached. Config and
tokenizer come from transformers' own GGUF parsing, so they are exactly what the HF reference sees.
Weights are dequantized to float32 with gguf-py, as transformers does, then stored in the dtype the
model runs in: float32 (the CPU default) matches transformers' GGUF-loaded state dict bit for bit,
bfloat16 (the GPU default) is that rounded exactly as a bf16 model loading the float32 copy would
round it, at half the disk. Each dtype's copy is made on the first load in that dtype.

Why a copy at all: dequantizing the GGUF at every start-up (gguf-py, numpy) is several times slower
than reading the copy (docs/decisions.md, loader).

Cache layout (`<cache root>/hf/<first 16 hex of the GGUF's sha256>-v<CONVERTER_VERSION>/`):

    config.json, generation_config.json, tokenizer files    made by the first conversion
    model.gguf             symlink to the GGUF last resolved to this directory: the weights' source
    weights-<dtype>/       model-0000N-of-0000M.safetensors + model.safetensors.index.json
    hotpath_source.json

Each directory appears by an atomic rename once complete, so concurrent processes converting the
same file never see, or leave, half of one.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import struct
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

GGUF_MAGIC = b"GGUF"
GGUF_LINK = "model.gguf"
# Bump when the output of the conversion changes: directories of older versions are not reused
# (and are deleted by the next conversion). v1: float32 only, keyed by the GGUF's name and mtime.
CONVERTER_VERSION = 2
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


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    qtype: int  # a gguf.GGMLQuantizationType value
    shape: tuple[int, ...]  # torch order: GGUF lists dims fastest first
    offset: int  # from the start of the file
    nbytes: int


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    metadata: dict[str, object]  # scalar and string values; arrays (the vocabulary) are skipped
    tensors: list[GGUFTensor]


# GGUF value types: struct format of each scalar type; 8 is a string, 9 an array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class _Cursor:
    """Reads little-endian GGUF header values; running off the end raises struct.error."""

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.off = buf, 0

    def take(self, fmt: str) -> tuple:
        values = struct.unpack_from("<" + fmt, self.buf, self.off)
        self.off += struct.calcsize("<" + fmt)
        return values

    def string(self) -> str:
        (n,) = self.take("Q")
        if self.off + n > len(self.buf):
            raise struct.error("string runs past the end of the file")
        self.off += n
        return self.buf[self.off - n:self.off].decode("utf-8", errors="replace")

    def value(self, vtype: int) -> object:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, n = self.take("IQ")
            if etype in _SCALARS:
                self.off += n * struct.calcsize(_SCALARS[etype])
            elif etype == _STRING:  # the vocabulary: skipped, not decoded (transformers reads it)
                for _ in range(n):
                    (length,) = self.take("Q")
                    self.off += length
            else:
                for _ in range(n):
                    self.value(etype)
            return None  # an over-run shows at the next read
        if vtype not in _SCALARS:
            raise ValueError(f"unknown GGUF value type {vtype}")
        return self.take(_SCALARS[vtype])[0]


def open_gguf(path: str | Path) -> GGUFFile:
    """The metadata and tensor table of a GGUF, with clear errors for missing, foreign or truncated files.

    Parsed here rather than by gguf.GGUFReader, which also builds a numpy view of every vocabulary
    entry: 8 s for a 150k vocab, against 0.03 s for what the loader needs.
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    _check_magic(path)
    size = path.stat().st_size
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            cur = _Cursor(buf)
            _, version, n_tensors, n_kv = cur.take("4sIQQ")
            if version not in (2, 3):
                raise ValueError(f"GGUF version {version} is not supported (big-endian file?)")
            metadata = {}
            for _ in range(n_kv):
                key = cur.string()
                metadata[key] = cur.value(cur.take("I")[0])
            table = []
            for _ in range(n_tensors):
                name = cur.string()
                (n_dims,) = cur.take("I")
                dims = cur.take(f"{n_dims}Q")
                qtype, offset = cur.take("IQ")
                table.append((name, dims, GGMLQuantizationType(qtype), offset))
            align = int(metadata.get("general.alignment", 32))
            data_start = cur.off + (-cur.off) % align
        tensors = []
        for name, dims, qtype, offset in table:
            block, block_bytes = GGML_QUANT_SIZES[qtype]
            n = int(np.prod(dims, dtype=np.int64))
            tensors.append(GGUFTensor(name, qtype, tuple(reversed(dims)), data_start + offset,
                                      n // block * block_bytes))
    except (struct.error, ValueError, OverflowError) as e:
        raise ValueError(f"{path} is not a valid GGUF file (truncated or corrupt?): {e}") from e
    end = max((t.offset + t.nbytes for t in tensors), default=0)
    if end > size:
        raise ValueError(f"{path} is not a valid GGUF file: truncated, tensor data needs {end} bytes, "
                         f"file has {size}")
    return GGUFFile(path, metadata, tensors)


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


def gguf_to_hf_dir(gguf_path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Convert a GGUF file into a cached HF-style model directory and return its path.

    `cache_dir` is the cache root (default: hotpath's, see hotpath.assets). The directory is keyed by
    the file's sha256, so a second call, for this path or any copy of the file, returns at once; its
    weights are made by `weights_dir` when the model is first loaded in a given dtype.
    """
    from hotpath.assets import default_cache_dir, file_sha256

    gguf_path = Path(gguf_path).resolve()
    _check_magic(gguf_path)
    root = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "hf"
    sha256 = file_sha256(gguf_path, cache_dir)
    out = root / f"{sha256[:16]}-v{CONVERTER_VERSION}"
    if not out.is_dir():
        # Our errors for a truncated, corrupt or unsupported file come clearer than transformers'.
        for t in open_gguf(gguf_path).tensors:
            hf_tensor_name(t.name)
        root.mkdir(parents=True, exist_ok=True)
        _build_dir(out, lambda tmp: _convert(gguf_path, sha256, tmp))
        _remove_stale(root)
    _point_link(out, gguf_path)
    return out


def weights_dir(model_dir: Path, dtype: torch.dtype) -> Path:
    """The directory holding `model_dir`'s safetensors: the directory itself, or for a converted
    GGUF its weights in `dtype` (or float32, when that copy exists), made now if neither does."""
    link = model_dir / GGUF_LINK
    if not link.is_symlink():
        return model_dir
    out = model_dir / f"weights-{str(dtype).removeprefix('torch.')}"
    if out.is_dir():
        return out
    fp32 = model_dir / "weights-float32"
    if fp32.is_dir():
        return fp32  # loading casts it exactly as a copy in `dtype` would hold it: no second copy
    if not link.exists():
        raise FileNotFoundError(
            f"{model_dir} has no {dtype} weights yet and the GGUF they come from, "
            f"{os.readlink(link)}, is gone: load the model by a GGUF path (or a known model name)")
    config = json.loads((model_dir / "config.json").read_text())
    _build_dir(out, lambda tmp: _write_weights(open_gguf(link.resolve()), config, tmp, dtype))
    return out


def dequantized_copy(model_dir: Path, dtype: torch.dtype, out: Path) -> Path:
    """A plain HF directory at `out` (config.json and links to the `dtype` safetensors, made now
    if missing) that loads a converted GGUF's 16-bit copy as any checkpoint, on a GPU too, where
    the GGUF itself runs kept quantized: the 16-bit side of a comparison."""
    weights = weights_dir(model_dir, dtype)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model_dir / "config.json", out / "config.json")
    for f in weights.iterdir():
        if not (out / f.name).exists():
            (out / f.name).symlink_to(f)
    return out


def _build_dir(out: Path, build: Callable[[Path], None]) -> None:
    """Fill a temp dir next to `out`, then rename it to `out` in one step; if a concurrent process
    renamed its own first, keep that one."""
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    try:
        build(tmp)
        # mkdtemp and safetensors create owner-only entries; the cache is ordinary readable data.
        for f in tmp.iterdir():
            if not f.is_symlink():  # chmod would follow the link to the user's GGUF
                f.chmod(0o644)
        tmp.chmod(0o755)
        try:
            os.rename(tmp, out)
        except OSError:
            if not out.is_dir():  # not a concurrent converter winning the race
                raise
            shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _point_link(out: Path, gguf_path: Path) -> None:
    """Point `out`'s weight source at `gguf_path`, atomically. Any path works, since every file that
    resolves here has the same content; the latest is the one known to exist now."""
    link = out / GGUF_LINK
    if link.is_symlink() and os.readlink(link) == str(gguf_path):
        return
    tmp = out / f".{GGUF_LINK}.{uuid.uuid4().hex}"
    os.symlink(gguf_path, tmp)
    os.replace(tmp, link)


def _remove_stale(root: Path) -> None:
    """Delete conversions by older CONVERTER_VERSIONs: never read again, and a v1 one is GBs."""
    for old in root.iterdir():
        source = old / "hotpath_source.json"
        if ".tmp-" in old.name or not source.is_file():
            continue
        try:
            version = json.loads(source.read_text()).get("converter_version")
        except (OSError, ValueError, AttributeError):
            continue  # not written by hotpath: leave it alone
        if isinstance(version, int) and version < CONVERTER_VERSION:
            shutil.rmtree(old, ignore_errors=True)


def _convert(gguf_path: Path, sha256: str, out: Path) -> None:
    """Everything but the weights, which weights_dir makes per dtype from the linked GGUF."""
    _write_config_and_tokenizer(gguf_path, out)
    (out / "hotpath_source.json").write_text(json.dumps(
        {"sha256": sha256, "size": gguf_path.stat().st_size, "first_converted_from": str(gguf_path),
         "converter_version": CONVERTER_VERSION}, indent=2) + "\n")
    os.symlink(gguf_path, out / GGUF_LINK)


def _write_config_and_tokenizer(gguf_path: Path, out: Path) -> None:
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


def _write_weights(gguf: GGUFFile, config: dict, out: Path, dtype: torch.dtype) -> None:
    from safetensors.torch import save_file
    from tqdm import tqdm

    arch = str(gguf.metadata["general.architecture"])
    n_head = config["num_attention_heads"]
    n_kv = config.get("num_key_value_heads") or n_head

    # Plan shards from the header (element counts) so file names carry N before any data is read.
    tensors = [t for t in gguf.tensors if hf_tensor_name(t.name) is not None]
    itemsize = dtype.itemsize
    shard_of, shard, used = [], 0, 0
    for t in tensors:
        nbytes = int(np.prod(t.shape)) * itemsize
        if used and used + nbytes > SHARD_BYTES:
            shard, used = shard + 1, 0
        shard_of.append(shard)
        used += nbytes
    n_shards = shard + 1

    weight_map: dict[str, str] = {}
    total = 0
    current: dict[str, torch.Tensor] = {}
    data = np.memmap(gguf.path, dtype=np.uint8, mode="r")
    for i, t in enumerate(tqdm(tensors, desc=f"converting {arch} GGUF to {dtype}", unit="tensor")):
        name = hf_tensor_name(t.name)
        # The model's parameters are all created in its dtype (hotpath.loader.model_loader), so this
        # rounds (to nearest even) exactly as copying the float32 tensor into the parameter would.
        current[name] = torch.from_numpy(_dequantized(data, t, arch, n_head, n_kv)).to(dtype)
        total += current[name].nbytes
        file = f"model-{shard_of[i] + 1:05d}-of-{n_shards:05d}.safetensors"
        weight_map[name] = file
        if i + 1 == len(tensors) or shard_of[i + 1] != shard_of[i]:
            save_file(current, out / file, metadata={"format": "pt"})
            current = {}
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _unpermuted(w: np.ndarray, t: GGUFTensor, arch: str, n_head: int, n_kv: int) -> np.ndarray:
    """A tensor's rows in HF's order (llama.cpp permutes llama's q / k rows; rows of GGUF blocks
    permute as rows of values do)."""
    if arch in _PERMUTED_ARCHS and t.name.endswith(("attn_q.weight", "attn_q.bias")):
        return unpermute_qk(w, n_head)
    if arch in _PERMUTED_ARCHS and t.name.endswith(("attn_k.weight", "attn_k.bias")):
        return unpermute_qk(w, n_kv)
    return w


def _dequantized(data: np.ndarray, t: GGUFTensor, arch: str, n_head: int, n_kv: int) -> np.ndarray:
    """A tensor dequantized to float32 (as transformers' GGUF loading does), HF's shape and row
    order, a writable C-contiguous array."""
    from gguf import dequantize

    w = np.asarray(dequantize(data[t.offset:t.offset + t.nbytes], t.qtype), dtype=np.float32)
    w = _unpermuted(w.reshape(t.shape), t, arch, n_head, n_kv)
    if not w.flags.writeable or not w.flags.c_contiguous:  # F32 tensors are views of the mmap
        w = np.array(w, copy=True, order="C")
    return w


def iterate_gguf(model_dir: Path, keeps_quantized: Callable[[str], bool],
                 desc: str = "Loading GGUF weights") -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) for every tensor of the GGUF `model_dir` was converted from: the tensors
    `keeps_quantized` names as their blocks, uint8 [rows, row bytes] (rows in HF's order), the
    rest dequantized to float32. No 16-bit copy is made or read."""
    from tqdm.auto import tqdm

    link = model_dir / GGUF_LINK
    if not link.exists():
        raise FileNotFoundError(f"{model_dir} is not a converted GGUF, or the GGUF it links to "
                                f"({os.readlink(link) if link.is_symlink() else 'none'}) is gone")
    gguf = open_gguf(link.resolve())
    config = json.loads((model_dir / "config.json").read_text())
    arch = str(gguf.metadata["general.architecture"])
    n_head = config["num_attention_heads"]
    n_kv = config.get("num_key_value_heads") or n_head
    data = np.memmap(gguf.path, dtype=np.uint8, mode="r")
    tensors = [t for t in gguf.tensors if hf_tensor_name(t.name) is not None]
    for t in tqdm(tensors, desc=desc, unit="tensor", leave=False):
        name = hf_tensor_name(t.name)
        if keeps_quantized(name):
            rows = int(np.prod(t.shape[:-1]))
            raw = data[t.offset:t.offset + t.nbytes].reshape(rows, t.nbytes // rows)
            yield name, torch.from_numpy(np.array(_unpermuted(raw, t, arch, n_head, n_kv), order="C"))
        else:
            yield name, torch.from_numpy(_dequantized(data, t, arch, n_head, n_kv))
