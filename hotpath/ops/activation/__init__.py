"""Gated activations."""

from hotpath.ops.activation.reference import silu_and_mul

__all__ = ["silu_and_mul"]
