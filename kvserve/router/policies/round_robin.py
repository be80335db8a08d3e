"""Round robin: each request to the next routable worker in turn."""

from __future__ import annotations

from collections.abc import Sequence

from kvserve.router.policies.base import RouteRequest
from kvserve.router.worker import Worker


class RoundRobinPolicy:
    name = "round_robin"
    needs_key = False

    def __init__(self) -> None:
        self.counter = 0

    def select(self, workers: Sequence[Worker], request: RouteRequest) -> Worker:
        worker = workers[self.counter % len(workers)]
        self.counter += 1
        return worker
