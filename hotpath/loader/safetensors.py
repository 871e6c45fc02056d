"""Stream tensors out of an HF checkpoint directory (one file or sharded with an index)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
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


def checkpoint_tensor_names(model_dir: Path) -> list[str]:
    """Every tensor name in the checkpoint, from the index or the files' headers (no data read)."""
    names: list[str] = []
    for f in checkpoint_files(model_dir):
        try:
            with safe_open(str(f), framework="pt", device="cpu") as h:
                names.extend(h.keys())
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{f} is not a readable safetensors file: {e}") from e
    return names


def iterate_safetensors(
    model_dir: Path, desc: str = "Loading weights", select: Callable[[str], bool] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yields (name, tensor) one at a time, so host memory holds one tensor, not the model;
    with `select`, only the tensors whose name it accepts (the others are not read)."""
    files = checkpoint_files(model_dir)
    handles = []
    total = 0
    for f in files:
        try:
            h = safe_open(str(f), framework="pt", device="cpu")
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{f} is not a readable safetensors file: {e}") from e
        names = [n for n in h.keys() if select is None or select(n)]
        handles.append((f, h, names))
        total += len(names)
    with tqdm(total=total, desc=desc, unit="tensor", leave=False) as bar:
        for f, h, names in handles:
            for name in names:
                try:
                    tensor = h.get_tensor(name)
                except (SafetensorError, OSError) as e:
                    raise ValueError(f"{f}: cannot read tensor {name!r}: {e}") from e
                yield name, tensor
                bar.update(1)
