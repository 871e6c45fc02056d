"""Tile configurations of the MoE kernels: tuned ones from JSON files, else a fixed rule.

A projection's configurations live in configs/E={E},N={N},K={K},device={device},dtype={dtype}.json,
for the expert weight [E, N, K] (gate_up: N = 2 * I, K = H; down: N = H, K = I), the GPU's name
as torch reports it (spaces as underscores) and the dtype's torch name (x's; for fp8 experts the
weights', float8_e4m3fn or float8_e4m3fnuz, whose dot tiles are held to one scale block along
K). benchmarks/tune_moe.py writes them:

    {"grouped": {"<tokens>": {"block_m": .., "block_n": .., "block_k": .., "group_m": ..,
                              "num_warps": .., "num_stages": ..}, ...},
     "decode":  {"<tokens>": {"block_n": .., "block_k": .., "num_warps": .., "num_stages": ..}, ...}}

A call with T tokens takes the configuration tuned at the nearest token count of its path's
section. Without a file (or that section), the default_* rules below apply. Nothing is tuned at
run time, so a first call can be captured in a CUDA graph.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

CONFIG_DIR = Path(__file__).resolve().parent / "configs"


@dataclass(frozen=True)
class GroupedConfig:
    """The grouped GEMM (many tokens): a program computes a [block_m, block_n] tile of one
    expert's rows; group_m M tiles in a row walk the same N tiles (weight tiles reused in L2)."""

    block_m: int
    block_n: int  # weight rows (for gate_up: block_n / 2 gate and up pairs)
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class DecodeConfig:
    """The decode kernels (few tokens): a program reads block_n rows of one expert's weight."""

    block_n: int  # weight rows (for gate_up: block_n / 2 gate and up pairs)
    block_k: int
    num_warps: int
    num_stages: int


def config_file(E: int, N: int, K: int, dtype: torch.dtype, device_name: str) -> str:
    dtype_name = str(dtype).removeprefix("torch.")
    return f"E={E},N={N},K={K},device={device_name.replace(' ', '_')},dtype={dtype_name}.json"


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


@functools.cache
def _load(path: Path) -> dict:
    if not path.is_file():
        return {}
    with open(path) as f:
        return json.load(f)


def tuned(section: str, E: int, N: int, K: int, dtype: torch.dtype, device: torch.device, T: int,
          config_dir: Path = CONFIG_DIR) -> dict | None:
    """The tuned configuration (as a dict) nearest to T tokens in `section` of the shape's file,
    or None where there is none."""
    entries = _load(config_dir / config_file(E, N, K, dtype, device_name(device))).get(section)
    if not entries:
        return None
    nearest = min(entries, key=lambda tokens: (abs(int(tokens) - T), int(tokens)))
    return entries[nearest]


def grouped_config(T: int, top_k: int, E: int, N: int, K: int, dtype: torch.dtype, device: torch.device,
                   config_dir: Path = CONFIG_DIR) -> GroupedConfig:
    found = tuned("grouped", E, N, K, dtype, device, T, config_dir)
    if found is not None:
        return GroupedConfig(**found)
    return default_grouped_config(T, top_k, E, N, K, hip=torch.version.hip is not None)


def decode_config(T: int, E: int, N: int, K: int, dtype: torch.dtype, device: torch.device,
                  config_dir: Path = CONFIG_DIR, top_k: int = 0) -> DecodeConfig:
    """top_k: the down projection's, where its one-token kernel's default tiles depend on it."""
    found = tuned("decode", E, N, K, dtype, device, T, config_dir)
    if found is not None:
        return DecodeConfig(**found)
    return default_decode_config(T, K, top_k)


def default_grouped_config(T: int, top_k: int, E: int, N: int, K: int, hip: bool) -> GroupedConfig:
    """M tiles about as tall as an expert's share of the tokens (padding wastes at most a tile per
    expert), wider N tiles once tiles are tall; 64-wide K tiles pipelined in 3 stages (2 on AMD,
    whose 64 KB of LDS hold two stages of the largest tiles here). A guess, not a measurement:
    the tuner's files replace it."""
    tokens_per_expert = T * top_k / E
    block_m = 16 if tokens_per_expert <= 16 else 32 if tokens_per_expert <= 32 else 64
    block_n = 64 if block_m <= 32 else 128
    block_k = min(64, max(16, _pow2_at_least(K)))
    return GroupedConfig(block_m, block_n, block_k, group_m=1 if block_m == 16 else 8, num_warps=4,
                         num_stages=2 if hip else 3)


def default_decode_config(T: int, K: int, top_k: int = 0) -> DecodeConfig:
    """Borrowed from the dense GEMV kernel (hotpath.ops.linear.triton_gemv), whose tiles were
    measured on dense projections, not on experts: one token, element-wise sums over 8-row
    tiles as wide as K up to 2048; more tokens, tensor-core dots on 32 x 256 tiles in 3 stages.
    The down projection at one token (top_k given) holds k tiles at once: 4 rows by 256."""
    if T == 1 and top_k:
        return DecodeConfig(block_n=4, block_k=min(256, max(16, _pow2_at_least(K))), num_warps=4, num_stages=1)
    if T == 1:
        block_k = min(2048, max(16, _pow2_at_least(K)))
        return DecodeConfig(block_n=8, block_k=block_k, num_warps=8 if block_k >= 2048 else 4, num_stages=1)
    return DecodeConfig(block_n=32, block_k=min(256, max(16, _pow2_at_least(K))), num_warps=4, num_stages=3)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def to_json(config: GroupedConfig | DecodeConfig) -> dict:
    return asdict(config)
