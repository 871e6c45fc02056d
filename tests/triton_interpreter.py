"""Triton's interpreter (TRITON_INTERPRET=1) without its repeated language patching.

A kernel launch under the interpreter (GridExecutor.__call__) patches triton.language for the
interpreter once (_patch_lang: every builtin of tl, tl.tensor, tl.math and tl.core found with
inspect.getmembers) and restores it when the grid is done. Each call of a @triton.jit helper from
inside the kernel (InterpretedFunction.__call__) runs _patch_lang again, at every call in every
program of the grid, though the launch has already patched the same modules, and drops the scope
it returns (nothing is restored). On the tiny models' decode steps that repetition was ~30% of the
interpreted kernels' CPU time (tests/ops/test_model_interpreter.py).

`skip_repeated_patching()` makes a helper call skip _patch_lang where the running launch has
already patched every language module the helper's globals hold, which is what that call would
patch; anything else (a helper that sees a module the launch did not patch, a call outside a
launch) patches as before. The kernels' semantics are untouched: the same interpreted functions
run on the same patched modules. Where Triton's internals differ from these (another version),
nothing is changed.
"""

from __future__ import annotations

import functools
import inspect


def skip_repeated_patching() -> bool:
    """Installs the skip in this process (once); returns whether it is installed."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    if getattr(interpreter, "_hotpath_tests_skip_repeated_patching", False):
        return True
    grid_call = getattr(getattr(interpreter, "GridExecutor", None), "__call__", None)
    patch_lang = getattr(interpreter, "_patch_lang", None)
    scope_class = getattr(interpreter, "_LangPatchScope", None)
    if grid_call is None or patch_lang is None or scope_class is None:
        return False
    try:  # the function _patch_lang finds the language modules by (Triton 3.x)
        source = inspect.getsource(patch_lang)
    except (OSError, TypeError):
        return False
    if "fn.__globals__" not in source or "value in [tl, tl.core]" not in source:
        return False

    patched: list[frozenset[int]] = []  # the running launch's patched language modules (ids), if any

    @functools.lru_cache(maxsize=None)
    def langs_of(globals_id: int, fn) -> frozenset[int]:
        return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))

    def skipping_patch_lang(fn):
        langs = langs_of(id(fn.__globals__), fn)
        if patched and langs <= patched[-1]:
            return scope_class()  # nothing to patch: the launch's own patches are in place
        scope = patch_lang(fn)
        if patched:
            patched[-1] = patched[-1] | langs
        return scope

    def tracking_grid_call(self, *args, **kwargs):
        patched.append(frozenset())  # filled by this launch's own _patch_lang call
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            patched.pop()

    interpreter._patch_lang = skipping_patch_lang
    interpreter.GridExecutor.__call__ = tracking_grid_call
    interpreter._hotpath_tests_skip_repeated_patching = True
    return True
