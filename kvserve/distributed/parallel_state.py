"""A rank's place in its tensor-parallel group, passed explicitly to every layer that shards.

``SINGLE`` (size 1, no group) is the default: layers built with it are today's unsharded ones
and call no collective."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TPGroup:
    rank: int = 0
    size: int = 1
    group: Any = None  # torch.distributed ProcessGroup of the forward's collectives (nccl/gloo)
    cpu_group: Any = None  # gloo group the step plans travel on (long timeout: ranks idle)

    @property
    def is_parallel(self) -> bool:
        return self.size > 1

    def split(self, total: int, what: str) -> int:
        """This rank's share of ``total`` units that must divide evenly."""
        if total % self.size:
            from kvserve.errors import ConfigError

            raise ConfigError(
                f"tensor parallelism: {what} ({total}) is not divisible by --tp {self.size}"
            )
        return total // self.size


SINGLE = TPGroup()


@dataclass(frozen=True)
class RankLayout:
    """Where ranks run: ``tp`` ranks over ``nnodes`` hosts, ``tp // nnodes`` per host; host
    ``node_rank`` runs ranks ``node_rank * per_node ..``; rank 0 (node 0) holds the scheduler."""

    tp: int = 1
    nnodes: int = 1
    node_rank: int = 0

    @property
    def per_node(self) -> int:
        return self.tp // self.nnodes

    @property
    def local_ranks(self) -> range:
        first = self.node_rank * self.per_node
        return range(first, first + self.per_node)

    def local_index(self, rank: int) -> int:
        """The GPU index of ``rank`` on its host."""
        return rank % self.per_node
