"""The one-shot all-reduce over symmetric peer buffers, fused with the residual add and RMSNorm
(+ fp8 quantization): the torch reference (reference.py) and the Triton kernel (triton.py) take
the same PeerBuffers (peers.py). hotpath.distributed's GroupCoordinator decides when to use it."""

from hotpath.ops.allreduce.peers import MAX_PROGRAMS, PeerBuffers, make_local_peers, signal_pad_words

__all__ = ["MAX_PROGRAMS", "PeerBuffers", "make_local_peers", "signal_pad_words"]
