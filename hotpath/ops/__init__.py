"""Ops: one folder per op family, each holding the readable torch reference (and, beside it, the
fast kernels that are tested against it)."""
