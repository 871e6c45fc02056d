"""Ops: one folder per op family, each holding the readable torch reference and, beside it, the
Triton kernels tested against it. Each folder's package functions dispatch between the two
(see backend.py)."""

from hotpath.ops.backend import get_backend, set_backend

__all__ = ["get_backend", "set_backend"]
