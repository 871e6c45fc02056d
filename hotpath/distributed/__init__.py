"""Process groups and the collectives the parallel layers call (tensor and expert parallelism).

- parallel_state.py: GroupCoordinator (a rank's view of a group and its collectives, choosing
  per message between the local op, gloo, the one-shot symmetric-memory kernel and NCCL),
  Parallel, building_parallel / current_parallel, shard_range;
- init.py: init_distributed / destroy_distributed, one worker's process groups (tcp:// or env://);
- symmetric.py: the tp group's symmetric-memory buffers for the one-shot all-reduce;
- env.py: NVLink multicast forced off before NCCL or symmetric memory start.
"""
