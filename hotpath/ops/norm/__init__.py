"""RMSNorm."""

from hotpath.ops.norm.reference import fused_add_rms_norm, rms_norm

__all__ = ["fused_add_rms_norm", "rms_norm"]
