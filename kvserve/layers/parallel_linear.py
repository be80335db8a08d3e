"""Tensor-parallel linear layers (Megatron-style). Each rank holds a slice of the weight and
takes its slice of every checkpoint tensor (weights and scales: ``kvserve.distributed.sharding``)
before the quant method sees it, so methods stay unaware of parallelism.

- Column-parallel: output rows split (q/k/v heads, gate/up); the output stays sharded.
- Row-parallel: input columns split (o_proj, down_proj); partial sums are all-reduced, then the
  bias is added once."""

from __future__ import annotations

import torch

from kvserve.distributed.collectives import all_reduce
from kvserve.distributed.parallel_state import TPGroup
from kvserve.distributed.sharding import column_shard, row_shard
from kvserve.layers.linear import Linear
from kvserve.quant.method import LinearMethod


class ColumnParallelLinear(Linear):
    """``parts[i] = (start, size)``: the output rows of checkpoint shard ``i`` this rank holds
    (a rank may hold a replicated slice, e.g. a KV head shared by several ranks)."""

    def __init__(
        self, in_features: int, full_sizes: list[int], parts: list[tuple[int, int]], bias: bool,
        dtype: torch.dtype, method: LinearMethod | None = None, prefix: str = "",
    ) -> None:  # fmt: skip
        super().__init__(in_features, [size for _, size in parts], bias, dtype, method, prefix)
        self.full_sizes, self.parts = full_sizes, parts

    def load_shard(self, param_name: str, loaded: torch.Tensor, shard: int = 0) -> None:
        start, size = self.parts[shard]
        what = f"{self.prefix}.{param_name}[{shard}]"
        part = column_shard(loaded, self.full_sizes[shard], start, size, what)
        super().load_shard(param_name, part, shard)


class RowParallelLinear(Linear):
    def __init__(
        self, in_features: int, out_sizes: list[int], bias: bool, dtype: torch.dtype,
        tp: TPGroup, method: LinearMethod | None = None, prefix: str = "",
    ) -> None:  # fmt: skip
        local = tp.split(in_features, f"{prefix} input features")
        super().__init__(local, out_sizes, bias, dtype, method, prefix)
        self.full_in, self.tp = in_features, tp

    def load_shard(self, param_name: str, loaded: torch.Tensor, shard: int = 0) -> None:
        if param_name != "bias":
            what = f"{self.prefix}.{param_name}"
            loaded = row_shard(loaded, self.full_in, self.tp.rank, self.tp.size, what)
        super().load_shard(param_name, loaded, shard)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._reduced(self.method.apply(self, x, None))

    def forward_after_silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor | None:
        partial = self.method.apply_after_silu_mul(self, gate_up, None)
        return None if partial is None else self._reduced(partial)

    def _reduced(self, partial: torch.Tensor) -> torch.Tensor:
        """The ranks' partial products summed, then the bias (added once)."""
        y = all_reduce(partial, self.tp)
        return y if self.bias is None else y + self.bias


def even_parts(sizes: list[int], tp: TPGroup, prefix: str) -> list[tuple[int, int]]:
    """Each shard split evenly: rank r holds rows [r * n / size, (r + 1) * n / size)."""
    parts = []
    for n in sizes:
        local = tp.split(n, f"{prefix} output rows")
        parts.append((tp.rank * local, local))
    return parts


def local_kv_heads(num_kv_heads: int, tp: TPGroup) -> tuple[int, int]:
    """(first KV head, count) this rank holds: split when there are at least as many heads as
    ranks, else one head replicated on ``size / num_kv_heads`` ranks."""
    from kvserve.errors import ConfigError

    if num_kv_heads % tp.size and tp.size % num_kv_heads:
        raise ConfigError(
            f"tensor parallelism: {num_kv_heads} KV heads neither split over nor replicate "
            f"evenly on --tp {tp.size}"
        )
    return tp.rank * num_kv_heads // tp.size, max(1, num_kv_heads // tp.size)
