"""Tensor parallelism over torch.distributed: the process group, the rank's place in it, the
collectives the layers call, the per-step plan broadcast and the worker processes' launch."""
