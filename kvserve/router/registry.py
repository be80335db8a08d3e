"""The set of workers, changed at run time (CLI list, worker file, /workers API) without a
restart. Removing a worker only stops new requests to it: requests in flight keep their
`Worker` object and finish. `on_add` lets the health checker probe a new worker at once."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from kvserve.router.config import BreakerConfig
from kvserve.router.worker import Worker, WorkerSpec

log = logging.getLogger("kvserve.router")


class WorkerRegistry:
    def __init__(self, breaker: BreakerConfig) -> None:
        self.breaker = breaker
        self.workers: dict[str, Worker] = {}
        self.on_add: Callable[[Worker], None] = lambda worker: None
        self.on_remove: Callable[[Worker], None] = lambda worker: None

    def add(self, spec: WorkerSpec, source: str) -> Worker:
        """Adds a worker, or updates the key/role/draining of one already there."""
        worker = self.workers.get(spec.url)
        if worker is not None:
            worker.update(spec)
            return worker
        worker = Worker.create(spec, self.breaker, source)
        self.workers[spec.url] = worker
        log.info("worker added: %s (%s, from %s)", spec.url, spec.role, source)
        self.on_add(worker)
        return worker

    def drain(self, url: str) -> Worker | None:
        worker = self.workers.get(url)
        if worker is not None and not worker.spec.draining:
            s = worker.spec
            worker.update(WorkerSpec(s.url, s.api_key, s.role, draining=True))
            log.info("worker draining: %s (%d in flight)", url, worker.outstanding)
        return worker

    def remove(self, url: str) -> Worker | None:
        worker = self.workers.pop(url, None)
        if worker is not None:
            log.info("worker removed: %s (%d in flight finish)", url, worker.outstanding)
            self.on_remove(worker)
        return worker

    def sync(self, specs: Iterable[WorkerSpec], source: str) -> None:
        """Makes the workers from `source` equal `specs`: new ones added, changed ones updated,
        missing ones removed. Workers from other sources are left alone."""
        wanted = {spec.url: spec for spec in specs}
        for url, worker in list(self.workers.items()):
            if worker.source == source and url not in wanted:
                self.remove(url)
        for spec in wanted.values():
            self.add(spec, source)

    def routable(self, role: str = "regular") -> list[Worker]:
        return [w for w in self.workers.values() if w.spec.role == role and w.routable]

    def __len__(self) -> int:
        return len(self.workers)
