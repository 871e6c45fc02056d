"""Structured output (guided decoding): a request's output held to a JSON schema, a regex, a
choice of strings or a grammar (`SamplingParams.structured_outputs`).

- `backend.py`: the grammar library (llguidance): constraints as its grammars, compiles, mask fills
- `compile_cache.py`: compiles on a thread pool, kept by (kind, spec) in a bounded LRU table
- `grammars.py`: the engine's side: each sequence's matcher, the tokens it accepts, a step's mask
- `bitmask.py`: the mask as it crosses to the runner (`TokenMask`), which applies it to the logits
  on the device (hotpath/ops/bitmask) before sampling
"""
