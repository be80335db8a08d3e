"""Does weights + KV cache fit one GPU per TP rank? The arithmetic, with its numbers kept."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvserve import kv_layout
from kvserve.kv_layout import KV_DTYPE_BYTES

__all__ = ["KV_DTYPE_BYTES", "MemoryFit", "kv_bytes_per_token", "kv_heads_per_rank"]


def kv_heads_per_rank(kv_heads: int, tp: int) -> int:
    # fewer KV heads than ranks: each rank keeps a replica of one head
    return max(1, math.ceil(kv_heads / tp))


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int, tp: int) -> int:
    """K and V for one token on one rank."""
    return kv_layout.kv_bytes_per_token(
        layers, kv_heads_per_rank(kv_heads, tp), head_dim, dtype_bytes
    )


@dataclass(frozen=True)
class MemoryFit:
    gpu_bytes: int
    mem_fraction: float
    weights_per_rank: int
    kv_per_token: int  # bytes, one rank
    context_length: int
    concurrency: int

    @property
    def budget(self) -> int:
        return int(self.gpu_bytes * self.mem_fraction)

    @property
    def kv_needed(self) -> int:
        return self.kv_per_token * self.context_length * self.concurrency

    @property
    def fits(self) -> bool:
        return self.weights_per_rank + self.kv_needed <= self.budget

    @property
    def pool_tokens(self) -> int:
        """KV tokens the budget holds beside the weights (the engine's pool, less what its
        activation profile then takes)."""
        return max(0, self.budget - self.weights_per_rank) // self.kv_per_token

    @property
    def max_concurrency(self) -> int:
        """Most requests of the full context length whose KV fits beside the weights."""
        free = self.budget - self.weights_per_rank
        return max(0, free // (self.kv_per_token * self.context_length))
