"""The vision tower of Qwen3-VL (dense and MoE) and of the Qwen3.5 image-text checkpoints.

Patches (each C x Tp x P x P pixels, flattened) -> one GEMM (the checkpoint's Conv3d, whose stride
is its kernel) + the learned position table bilinearly resized to each grid -> `depth` pre-norm
blocks (LayerNorm, attention with a 2D rotary within each image or video frame, LayerNorm, MLP)
-> the patch merger (LayerNorm, the 2x2 neighbours of each merged token concatenated, fc1, GELU,
fc2). Qwen3-VL's DeepStack also merges the hidden states after a few blocks (its own mergers,
which normalise after concatenating); the language model adds them to its first layers' outputs.
Qwen3.5 has no DeepStack.

Every image and video of a call runs as one batch: the GEMMs run once over all patches, and the
attention keeps images and frames apart through cu_seqlens (hotpath/ops/vision_attention).

Tensor parallelism: the tower is replicated on every rank (plain torch linears, no sharding);
each rank runs it whole on the same inputs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from hotpath.ops.norm import fused_add_layer_norm
from hotpath.ops.vision_attention import apply_rotary, varlen_attention

LAYER_NORM_EPS = 1e-6  # every LayerNorm of the tower (HF hard-codes it)
# the MLP activations the configs name (the patch mergers always use the exact GELU)
ACTIVATIONS = {
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
}


@dataclass(frozen=True)
class VisionConfig:
    """The fields of transformers' Qwen3VLVisionConfig (Qwen3VLMoeVisionConfig and
    Qwen3_5VisionConfig are the same, less DeepStack for Qwen3.5), with its defaults.
    `rope_theta` is rope_parameters["rope_theta"]; initializer_range is for training only."""

    depth: int = 27
    hidden_size: int = 1152
    hidden_act: str = "gelu_pytorch_tanh"
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    out_hidden_size: int = 3584
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)
    rope_theta: float = 10000.0

    @classmethod
    def from_hf(cls, vision_config: dict[str, Any]) -> VisionConfig:
        """From config.json's vision_config. Qwen3.5's (model_type qwen3_5*) has no DeepStack:
        transformers' Qwen3_5VisionConfig has no such field and its model ignores one that a
        config.json lists (the released ones list [])."""
        names = {f.name for f in fields(cls)} - {"deepstack_visual_indexes", "rope_theta"}
        values: dict[str, Any] = {k: vision_config[k] for k in names if k in vision_config}
        if str(vision_config.get("model_type", "")).startswith("qwen3_5"):
            values["deepstack_visual_indexes"] = ()
        elif "deepstack_visual_indexes" in vision_config:
            values["deepstack_visual_indexes"] = tuple(vision_config["deepstack_visual_indexes"])
        rope = vision_config.get("rope_parameters") or {}
        if rope.get("rope_type", "axial") != "axial":
            raise ValueError(f"the vision tower's rotary must be axial, got rope_type {rope['rope_type']!r}")
        values["rope_theta"] = float(rope.get("rope_theta", vision_config.get("rope_theta", cls.rope_theta)))
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        for name in ("patch_size", "temporal_patch_size", "spatial_merge_size"):
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"vision {name} must be an int, got {getattr(self, name)!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"vision hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}")
        if self.head_dim % 4:
            # the axial rotary gives a quarter of head_dim's frequencies to each of h and w
            raise ValueError(f"vision head_dim {self.head_dim} must be a multiple of 4")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"vision hidden_act {self.hidden_act!r} is not one of {sorted(ACTIVATIONS)}")
        indexes = self.deepstack_visual_indexes
        if len(set(indexes)) != len(indexes) or not all(0 <= i < self.depth for i in indexes):
            raise ValueError(f"deepstack_visual_indexes {list(indexes)} must be distinct layers in [0, {self.depth})")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Pixel values a patch: C * Tp * P * P."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def merged_size(self) -> int:
        """Width of a merged token before the merger's fc2: hidden_size * merge**2."""
        return self.hidden_size * self.spatial_merge_size**2


def _resize_taps(size: int, side: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The two source rows (and their weights) of a bilinear resize from `side` to `size` with
    align_corners=True, [size, 2] each, computed as transformers computes them."""
    src = torch.arange(size, dtype=torch.float32, device=device) * (side - 1) / max(size - 1, 1)
    floor = torch.floor(src)
    taps = floor.long()[:, None] + torch.arange(2, device=device)
    weights = (1 - (src[:, None] - taps.float()).abs()).clamp(min=0)
    return taps.clamp(max=side - 1), weights


@dataclass(frozen=True)
class Segments:
    """What attends to what: each image and each video frame on its own."""

    lengths: list[int]  # patches of each image / frame, in order
    cu_seqlens: torch.Tensor  # [len(lengths) + 1] int32 on the device: their offsets

    @classmethod
    def of(cls, grid_thw: list[tuple[int, int, int]], device: torch.device) -> Segments:
        lengths = [h * w for t, h, w in grid_thw for _ in range(t)]
        cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        return cls(lengths, cu.to(device))


class PatchMerger(nn.Module):
    """LayerNorm, each merge x merge block of tokens concatenated, fc1, GELU, fc2. The main merger
    normalises each token before concatenating; DeepStack's normalise the concatenation."""

    def __init__(self, cfg: VisionConfig, norm_after_concat: bool):
        super().__init__()
        self.merged_size, self.norm_after_concat = cfg.merged_size, norm_after_concat
        self.norm = nn.LayerNorm(cfg.merged_size if norm_after_concat else cfg.hidden_size, eps=LAYER_NORM_EPS)
        self.linear_fc1 = nn.Linear(cfg.merged_size, cfg.merged_size)
        self.linear_fc2 = nn.Linear(cfg.merged_size, cfg.out_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_patches, hidden] -> [num_merged, out_hidden]
        if self.norm_after_concat:
            x = self.norm(x.view(-1, self.merged_size))
        else:
            x = self.norm(x).view(-1, self.merged_size)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class VisionAttention(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: Segments) -> torch.Tensor:
        num_patches = x.shape[0]
        qkv = self.qkv(x).view(num_patches, 3, self.num_heads, self.head_dim)
        qk = apply_rotary(qkv[:, :2].flatten(1, 2), cos, sin).view(num_patches, 2, self.num_heads, self.head_dim)
        out = varlen_attention(qk[:, 0], qk[:, 1], qkv[:, 2], segments.cu_seqlens, max(segments.lengths),
                               self.head_dim**-0.5, segments.lengths)
        return self.proj(out.view(num_patches, -1))


class VisionMLP(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.act = ACTIVATIONS[cfg.hidden_act]
        # on NVIDIA, cuBLASLt applies the tanh GELU to fc1's fp32 results (one pass less, and one
        # rounding to 16 bits instead of two)
        self.gelu_epilogue = cfg.hidden_act == "gelu_pytorch_tanh"
        self.linear_fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.linear_fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fc1 = self.linear_fc1
        if self.gelu_epilogue and x.is_cuda and torch.version.hip is None:
            h = torch._addmm_activation(fc1.bias, x, fc1.weight.t(), use_gelu=True)
        else:
            h = self.act(fc1(x))
        return self.linear_fc2(h)


def _add_norm(x: torch.Tensor, residual: torch.Tensor, norm: nn.LayerNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(residual + x), residual + x) in one pass."""
    return fused_add_layer_norm(x, residual, norm.weight, norm.bias, norm.eps)


class VisionBlock(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden_size, eps=LAYER_NORM_EPS)
        self.norm2 = nn.LayerNorm(cfg.hidden_size, eps=LAYER_NORM_EPS)
        self.attn = VisionAttention(cfg)
        self.mlp = VisionMLP(cfg)

    def forward(self, residual: torch.Tensor, normed: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                segments: Segments, next_norm: nn.LayerNorm | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """residual: the stream before the block, normed: norm1(residual). Returns the stream after
        the block and next_norm(it) (None without a next norm): each residual add fused with the
        norm after it."""
        normed, residual = _add_norm(self.attn(normed, cos, sin, segments), residual, self.norm2)
        out = self.mlp(normed)
        if next_norm is None:
            return residual + out, None
        normed, residual = _add_norm(out, residual, next_norm)
        return residual, normed


class PatchEmbed(nn.Module):
    """The checkpoint's Conv3d [hidden, C, Tp, P, P] as the GEMM it is (stride == kernel):
    proj.weight is held as [hidden, C * Tp * P * P]."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.proj = nn.Linear(cfg.patch_dim, cfg.hidden_size)
        self.conv_shape = (cfg.hidden_size, cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size,
                           cfg.patch_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.proj(pixel_values.to(self.proj.weight.dtype))


class VisionTower(nn.Module):
    """Parameter names are the checkpoint's under `model.visual.`."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        cfg.validate()
        self.config = cfg
        self.patch_embed = PatchEmbed(cfg)
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, cfg.hidden_size)
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg, norm_after_concat=False)
        self.deepstack_merger_list = nn.ModuleList(
            PatchMerger(cfg, norm_after_concat=True) for _ in cfg.deepstack_visual_indexes)

    def forward(
        self,
        pixel_values: torch.Tensor,  # [num_patches, C * Tp * P * P]
        grid_thw: list[tuple[int, int, int]],  # per image / video: frames, patch rows, patch columns
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(merged embeddings [num_patches // merge**2, out_hidden_size], one DeepStack feature of
        that shape per deepstack index, in layer order), in the model's dtype. Patches come in
        the processor's order: per image and frame, merge x merge blocks row-major, each block's
        patches row-major."""
        grid_thw = [(int(t), int(h), int(w)) for t, h, w in grid_thw]  # also from a [n, 3] tensor
        self._check_inputs(pixel_values, grid_thw)
        device = pixel_values.device
        coords = self._frame_coords(grid_thw, device)
        x = self.patch_embed(pixel_values)  # [num_patches, hidden]
        x = x + self._position_embeddings(grid_thw, coords, device).to(x.dtype)
        cos, sin = self._rotary(grid_thw, coords, device)
        segments = Segments.of(grid_thw, device)
        deepstack = []
        normed = self.blocks[0].norm1(x)
        for layer, block in enumerate(self.blocks):
            next_norm = self.blocks[layer + 1].norm1 if layer + 1 < len(self.blocks) else None
            x, normed = block(x, normed, cos, sin, segments, next_norm)
            if layer in self.config.deepstack_visual_indexes:
                merger = self.deepstack_merger_list[self.config.deepstack_visual_indexes.index(layer)]
                deepstack.append(merger(x))
        return self.merger(x), deepstack

    def _check_inputs(self, pixel_values: torch.Tensor, grid_thw: list[tuple[int, int, int]]) -> None:
        cfg, merge = self.config, self.config.spatial_merge_size
        if not grid_thw:
            raise ValueError("grid_thw is empty: the vision tower needs at least one image or video")
        for t, h, w in grid_thw:
            if t < 1 or h < merge or w < merge or h % merge or w % merge:
                raise ValueError(f"grid {(t, h, w)}: t must be >= 1 and h, w positive multiples of "
                                 f"spatial_merge_size {merge}")
        num_patches = sum(t * h * w for t, h, w in grid_thw)
        if tuple(pixel_values.shape) != (num_patches, cfg.patch_dim):
            raise ValueError(f"pixel_values has shape {tuple(pixel_values.shape)}; grid_thw needs "
                             f"({num_patches}, {cfg.patch_dim})")

    def _frame_coords(self, grid_thw: list[tuple[int, int, int]],
                      device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per image / video: the row and the column of each patch of a frame, in the order the
        patches come (merge x merge blocks row-major, each block row-major), [h * w] int64 each,
        made on the device (no host work for the GPU to wait on)."""
        merge = self.config.spatial_merge_size
        coords = []
        for _, h, w in grid_thw:
            shape = (h // merge, merge, w // merge, merge)
            r = torch.arange(h, device=device).view(h // merge, merge, 1, 1).expand(shape)
            c = torch.arange(w, device=device).view(1, 1, w // merge, merge).expand(shape)
            coords.append((r.transpose(1, 2).flatten(), c.transpose(1, 2).flatten()))
        return coords

    def _position_embeddings(self, grid_thw: list[tuple[int, int, int]],
                             coords: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device) -> torch.Tensor:
        """The learned side x side table resized bilinearly (align_corners=True, as transformers)
        to each frame's h x w grid, at every patch: [num_patches, hidden] fp32."""
        side = int(self.config.num_position_embeddings**0.5)
        indices, weights = [], []
        for (t, h, w), (r, c) in zip(grid_thw, coords):
            taps_h, weights_h = (x[r] for x in _resize_taps(h, side, device))  # [h * w, 2]
            taps_w, weights_w = (x[c] for x in _resize_taps(w, side, device))
            indices.append((taps_h[:, :, None] * side + taps_w[:, None, :]).flatten(1).repeat(t, 1))
            weights.append((weights_h[:, :, None] * weights_w[:, None, :]).flatten(1).repeat(t, 1))
        index, weight = torch.cat(indices), torch.cat(weights)  # [num_patches, 4]
        return (self.pos_embed(index) * weight[:, :, None]).sum(1)

    def _rotary(self, grid_thw: list[tuple[int, int, int]], coords: list[tuple[torch.Tensor, torch.Tensor]],
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [num_patches, head_dim] fp32 of the 2D rotary: a quarter of head_dim's
        angles from the patch's row, a quarter from its column, that half repeated (the
        rotate-half pairs), with transformers' frequencies."""
        half = self.config.head_dim // 2
        inv_freq = 1.0 / self.config.rope_theta ** (torch.arange(0, half, 2, dtype=torch.float32) / half)
        rows = torch.cat([r.repeat(t) for (t, _, _), (r, _) in zip(grid_thw, coords)])
        cols = torch.cat([c.repeat(t) for (t, _, _), (_, c) in zip(grid_thw, coords)])
        inv_freq = inv_freq.to(device)
        freqs = torch.cat((rows[:, None] * inv_freq, cols[:, None] * inv_freq), dim=-1)  # [num_patches, half]
        freqs = torch.cat((freqs, freqs), dim=-1)
        return freqs.cos(), freqs.sin()

    def weight_loaders(self) -> dict[str, Callable[[torch.Tensor], None]]:
        """{checkpoint name without the `model.visual.` prefix: loader}, a parameter each; the
        patch embedding's takes the checkpoint's Conv3d weight as its GEMM matrix. A loader raises
        ValueError for a shape its parameter does not take."""
        return {name: functools.partial(self._load, param, name == "patch_embed.proj.weight")
                for name, param in self.named_parameters()}

    def _load(self, param: nn.Parameter, conv: bool, tensor: torch.Tensor) -> None:
        shape = tuple(tensor.shape)
        if conv and shape == self.patch_embed.conv_shape:
            tensor = tensor.reshape(param.shape)
        elif shape != tuple(param.shape):
            raise ValueError(f"has shape {shape}, expected {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(tensor)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Fills every parameter from (name, tensor) pairs named as the checkpoint names them
        without the `model.visual.` prefix, one tensor at a time. Raises ValueError for a name
        the tower does not have, a shape it does not take, or a parameter left unfilled."""
        loaders = self.weight_loaders()
        missing = set(loaders)
        for name, tensor in weights:
            if name not in loaders:
                raise ValueError(f"the vision tower has no parameter {name!r}")
            try:
                loaders[name](tensor)
            except ValueError as e:
                raise ValueError(f"vision parameter {name!r} {e}") from None
            missing.discard(name)
        if missing:
            raise ValueError(f"the checkpoint leaves vision parameters unfilled: {sorted(missing)}")

    def flops(self, grid_thw: list[tuple[int, int, int]]) -> int:
        """Matmul and attention FLOPs (2 a multiply-add) of forward(grid_thw), for a roofline:
        the patch embedding, every block's qkv / proj / MLP GEMMs and its attention (q k^T and
        p v over each frame's h * w tokens, all heads), the merger and DeepStack mergers. Norms,
        activations, rotary and softmax are left out (under 1% of the FLOPs)."""
        cfg = self.config
        n = sum(t * h * w for t, h, w in grid_thw)
        hidden, merged = cfg.hidden_size, cfg.merged_size
        per_token = 2 * hidden * (3 * hidden + hidden + 2 * cfg.intermediate_size)
        attention = sum(t * 4 * (h * w) ** 2 * hidden for t, h, w in grid_thw)
        mergers = 1 + len(cfg.deepstack_visual_indexes)
        merge_gemms = mergers * 2 * (n // cfg.spatial_merge_size**2) * merged * (merged + cfg.out_hidden_size)
        return 2 * n * cfg.patch_dim * hidden + cfg.depth * (n * per_token + attention) + merge_gemms


__all__ = ["VisionConfig", "VisionTower"]
