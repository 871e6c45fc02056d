"""Writing a quantized checkpoint: safetensors shards (with an index when there are several), the
source's config.json with quantization_config added, and its tokenizer and generation files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

SHARD_BYTES = 2 << 30  # at most this many bytes of tensors per file
_COPIED = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json",
           "merges.txt", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
           "tokenizer.model")


class ShardedWriter:
    """Takes tensors one at a time; holds at most SHARD_BYTES of them before writing a file."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.current: dict[str, torch.Tensor] = {}
        self.current_bytes = 0
        self.files: list[tuple[str, list[str]]] = []  # temporary file name, its tensors
        self.total = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        if self.current and self.current_bytes + nbytes > SHARD_BYTES:
            self._flush()
        self.current[name] = tensor.detach().to("cpu").contiguous()
        self.current_bytes += nbytes
        self.total += nbytes

    def _flush(self) -> None:
        name = f"part-{len(self.files)}.safetensors"
        save_file(self.current, self.out_dir / name, metadata={"format": "pt"})
        self.files.append((name, list(self.current)))
        self.current, self.current_bytes = {}, 0

    def close(self) -> None:
        """Names the files as HF does (model.safetensors, or model-0000i-of-0000n + index)."""
        if self.current or not self.files:
            self._flush()
        n = len(self.files)
        if n == 1:
            (self.out_dir / self.files[0][0]).rename(self.out_dir / "model.safetensors")
            return
        weight_map = {}
        for i, (tmp, names) in enumerate(self.files):
            final = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            (self.out_dir / tmp).rename(self.out_dir / final)
            weight_map.update(dict.fromkeys(names, final))
        index = {"metadata": {"total_size": self.total}, "weight_map": weight_map}
        (self.out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def write_config(source_dir: Path, out_dir: Path, quantization_config: dict[str, Any],
                 dtype: torch.dtype) -> None:
    """config.json of the source with quantization_config (top level, as every published
    quantized checkpoint has it) and torch_dtype the dtype of the unquantized tensors."""
    config = json.loads((source_dir / "config.json").read_text())
    config.pop("quantization_config", None)
    config["quantization_config"] = quantization_config
    dtype_name = str(dtype).removeprefix("torch.")
    config["torch_dtype"] = dtype_name
    if "dtype" in config:  # transformers 5 writes this name
        config["dtype"] = dtype_name
    if isinstance(config.get("text_config"), dict):
        config["text_config"].pop("quantization_config", None)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for name in _COPIED:
        if (source_dir / name).is_file():
            shutil.copyfile(source_dir / name, out_dir / name)
