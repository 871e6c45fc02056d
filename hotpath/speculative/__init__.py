"""Speculative decoding: the n-gram drafter, the policy and the counters on the engine side; the
model-running drafters and the lossless verification on the worker side."""
