"""Rotary position embedding."""

from hotpath.ops.rotary.reference import apply_rotary

__all__ = ["apply_rotary"]
