"""Active health checks: every `interval_s`, GET `<worker><endpoint>` with `timeout_s`.
`failure_threshold` failures in a row eject a worker; `success_threshold` successes in a row
bring it back. A new worker is probed at once and routable after its first success, so a
router that starts with its workers is ready as soon as they are."""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from kvserve.router.config import HealthConfig
from kvserve.router.registry import WorkerRegistry
from kvserve.router.worker import Worker

log = logging.getLogger("kvserve.router")


def record_probe(worker: Worker, ok: bool, config: HealthConfig) -> None:
    first = not worker.checked
    worker.checked = True
    if ok:
        worker.health_failures, worker.health_successes = 0, worker.health_successes + 1
        if not worker.healthy and (first or worker.health_successes >= config.success_threshold):
            worker.healthy = True
            log.info("worker healthy: %s", worker.url)
        return
    worker.health_successes, worker.health_failures = 0, worker.health_failures + 1
    if worker.healthy and worker.health_failures >= config.failure_threshold:
        worker.healthy = False
        log.warning("worker ejected after %d failed health checks: %s",
                    worker.health_failures, worker.url)  # fmt: skip


class HealthChecker:
    def __init__(self, registry: WorkerRegistry, session: aiohttp.ClientSession,
                 config: HealthConfig) -> None:  # fmt: skip
        self.registry, self.session, self.config = registry, session, config
        self.timeout = aiohttp.ClientTimeout(total=config.timeout_s)
        self.pending: set[asyncio.Task[None]] = set()

    async def probe(self, worker: Worker) -> bool:
        try:
            async with self.session.get(worker.url + self.config.endpoint,
                                        headers=worker.auth_header,
                                        timeout=self.timeout) as resp:  # fmt: skip
                await resp.read()
                return resp.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    async def check(self, worker: Worker) -> None:
        record_probe(worker, await self.probe(worker), self.config)

    def check_soon(self, worker: Worker) -> None:
        """Probe a worker just added, without waiting for the next round."""
        task = asyncio.get_running_loop().create_task(self.check(worker))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.config.interval_s)
            workers = list(self.registry.workers.values())
            await asyncio.gather(*(self.check(w) for w in workers))
