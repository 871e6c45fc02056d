"""Outputs of two computation paths compared the way they can be compared on any CPU: token ids,
texts, ranks and finish reasons exactly, floats (logprobs) up to rounding."""

from __future__ import annotations

import dataclasses
import math

# Two paths run the same fp32 math on different shapes (a decode graph's padded batch, an async
# step that still carries finished rows), and the BLAS picks its kernel and summation order by
# shape and by CPU (MKL's AVX-512 and AVX2 kernels differ): each path rounds differently, by
# about fp32's epsilon (1.2e-7) relative. Measured between the graph and eager paths under MKL's
# AVX2 kernels: at most 8.5e-8 relative. 1e-5 leaves two orders of magnitude for other CPUs and
# libraries, and is still far below what a real mistake moves a logprob by (the tiny test models'
# top-2 logprobs lie ~1e-3 relative apart, and another row's or position's logits are further).
REL_TOL = 1e-5
ABS_TOL = 1e-6  # for logprobs near 0 (tokens of probability ~1), where relative means nothing


def first_difference(got: object, want: object, where: str = "") -> str | None:
    """None when `got` matches `want` (nested lists, tuples, dicts, dataclasses); otherwise where
    and how they first differ. Floats match up to REL_TOL / ABS_TOL, everything else exactly."""
    if isinstance(got, float) or isinstance(want, float):
        if isinstance(got, (int, float)) and isinstance(want, (int, float)) and math.isclose(
                got, want, rel_tol=REL_TOL, abs_tol=ABS_TOL):
            return None
        return f"at {where or 'top'}: {got!r} != {want!r}"
    if dataclasses.is_dataclass(got) and type(got) is type(want):
        return first_difference(vars(got), vars(want), where)
    if isinstance(got, dict) and isinstance(want, dict):
        if got.keys() != want.keys():
            return f"at {where or 'top'}: keys {sorted(got)} != {sorted(want)}"
        return next((d for k in got if (d := first_difference(got[k], want[k], f"{where}[{k!r}]"))), None)
    if isinstance(got, (list, tuple)) and type(got) is type(want):
        if len(got) != len(want):
            return f"at {where or 'top'}: length {len(got)} != {len(want)}: {got!r} != {want!r}"
        return next((d for i, (a, b) in enumerate(zip(got, want))
                     if (d := first_difference(a, b, f"{where}[{i}]"))), None)
    return None if got == want else f"at {where or 'top'}: {got!r} != {want!r}"
