"""Least outstanding requests: the worker with the fewest requests in flight through this
router; ties go round robin so equal workers share the load."""

from __future__ import annotations

from collections.abc import Sequence

from kvserve.router.policies.base import RouteRequest
from kvserve.router.worker import Worker


class LeastOutstandingPolicy:
    name = "least_outstanding"
    needs_key = False

    def __init__(self) -> None:
        self.counter = 0

    def select(self, workers: Sequence[Worker], request: RouteRequest) -> Worker:
        n = len(workers)
        start = self.counter % n
        self.counter += 1
        best = workers[start]
        for i in range(1, n):
            worker = workers[(start + i) % n]
            if worker.outstanding < best.outstanding:
                best = worker
        return best
