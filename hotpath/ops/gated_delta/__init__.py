"""Gated DeltaNet: the gated delta rule and the causal conv1d before it (reference.py, torch).
The Triton kernels (chunked prefill, fused recurrent decode) come with the hybrid models; until
then this package is the reference alone, and no model uses it."""
