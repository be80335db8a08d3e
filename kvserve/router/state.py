"""Everything one router process holds, built from a `RouterConfig`; the HTTP handlers reach it
through the aiohttp app. Background tasks: health checks, the worker file watcher and the
cache-aware trees' eviction."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
from aiohttp import web

from kvserve.router.config import RouterConfig
from kvserve.router.health import HealthChecker
from kvserve.router.metrics import RouterMetrics
from kvserve.router.pd_proxy import PDForwarder
from kvserve.router.policies.factory import make_pair_policy, make_policy
from kvserve.router.proxy import Forwarder
from kvserve.router.registry import WorkerRegistry
from kvserve.router.worker import make_spec
from kvserve.router.worker_file import WorkerFileWatcher


class RouterState:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.registry = WorkerRegistry(config.breaker)
        self.policy = make_policy(config.policy, config.cache_aware)
        self.pair_policy = (make_pair_policy(config.prefill_policy, config.decode_policy,
                                             config.cache_aware)
                            if config.pd_disaggregation else None)  # fmt: skip
        self.metrics = RouterMetrics()
        key = config.api_key
        self.expected_auth = f"Bearer {key}".encode() if key else None
        self.tasks: list[asyncio.Task[None]] = []
        self.watcher = (WorkerFileWatcher(config.worker_file, self.registry,
                                          config.worker_file_poll_s)
                        if config.worker_file else None)  # fmt: skip
        # Bad workers (flags or file) raise ConfigError here, before any socket is opened.
        for url in config.worker_urls:
            self.registry.add(make_spec(url, config.worker_api_key), "cli")
        for role, urls in (("prefill", config.prefill_urls), ("decode", config.decode_urls)):
            for url in urls:
                self.registry.add(make_spec(url, config.worker_api_key, role), "cli")
        if self.watcher is not None:
            self.watcher.load()

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=75)
        self.session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False,
            skip_auto_headers=("Accept-Encoding", "User-Agent"),
        )  # fmt: skip
        self.forwarder = Forwarder(self.config, self.registry, self.policy, self.metrics)
        # generation requests: the plain forwarder, or prefill/decode pairs
        self.generator = self.forwarder
        if self.pair_policy is not None:
            self.generator = PDForwarder(self.config, self.registry, self.policy,
                                         self.pair_policy, self.metrics)  # fmt: skip
        self.health = HealthChecker(self.registry, self.session, self.config.health)
        self.registry.on_add = self.health.check_soon
        self.registry.on_remove = lambda worker: self.forwarder.pool.forget(worker.url)
        for worker in self.registry.workers.values():
            self.health.check_soon(worker)
        loop = asyncio.get_running_loop()
        self.tasks.append(loop.create_task(self.health.run()))
        if self.watcher is not None:
            self.tasks.append(loop.create_task(self.watcher.run()))
        if hasattr(self.policy, "evict"):
            self.tasks.append(loop.create_task(self._evict_loop()))

    async def _evict_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.cache_aware.eviction_interval_s)
            self.policy.evict(self.registry.workers)  # type: ignore[attr-defined]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.session.close()


STATE: web.AppKey[RouterState] = web.AppKey("router_state", RouterState)
