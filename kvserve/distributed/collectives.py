"""The collectives the sharded layers call. Every one is a no-op at size 1, but sharded layers
only exist at size > 1, so the unsharded model never reaches them."""

from __future__ import annotations

import torch
import torch.distributed as dist

from kvserve.distributed.parallel_state import TPGroup


def all_reduce(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """Sum over ranks, in place (capturable in a CUDA graph once NCCL is warmed up)."""
    dist.all_reduce(x, group=tp.group)
    return x


def all_gather_last_dim(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """[..., n] on each rank -> [..., size * n], rank order."""
    parts = [torch.empty_like(x) for _ in range(tp.size)]
    dist.all_gather(parts, x.contiguous(), group=tp.group)
    return torch.cat(parts, dim=-1)


def min_over_ranks(value: int, tp: TPGroup, device: torch.device) -> int:
    if not tp.is_parallel:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=tp.group)
    return int(t.item())


def barrier(tp: TPGroup) -> None:
    if tp.is_parallel:
        dist.barrier(group=tp.cpu_group)
