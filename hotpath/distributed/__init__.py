"""Process groups and the collectives the parallel layers call (tensor and expert parallelism)."""
