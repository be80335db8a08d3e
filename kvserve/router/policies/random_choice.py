"""Random: a uniformly random routable worker (a baseline for the others)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from kvserve.router.policies.base import RouteRequest
from kvserve.router.worker import Worker


class RandomPolicy:
    name = "random"
    needs_key = False

    def __init__(self, seed: int | None = None) -> None:
        self.rng = random.Random(seed)

    def select(self, workers: Sequence[Worker], request: RouteRequest) -> Worker:
        return workers[self.rng.randrange(len(workers))]
