"""Stream tensors out of an HF checkpoint directory (one file or sharded with an index)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from tqdm.auto import tqdm


def checkpoint_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise ValueError(f"{index} is not a valid safetensors index: {e}") from e
        files = [model_dir / f for f in dict.fromkeys(weight_map.values())]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"checkpoint shards listed in {index} are missing: {missing}")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir}")
    return files


def iterate_safetensors(model_dir: Path, desc: str = "Loading weights") -> Iterator[tuple[str, torch.Tensor]]:
    """Yields (name, tensor) one at a time, so host memory holds one tensor, not the model."""
    files = checkpoint_files(model_dir)
    handles = []
    total = 0
    for f in files:
        try:
            h = safe_open(str(f), framework="pt", device="cpu")
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{f} is not a readable safetensors file: {e}") from e
        handles.append((f, h))
        total += len(h.keys())
    with tqdm(total=total, desc=desc, unit="tensor", leave=False) as bar:
        for f, h in handles:
            for name in h.keys():
                try:
                    tensor = h.get_tensor(name)
                except (SafetensorError, OSError) as e:
                    raise ValueError(f"{f}: cannot read tensor {name!r}: {e}") from e
                yield name, tensor
                bar.update(1)
