"""Drives a run: warmup, then closed loop (--max-concurrency) or open loop (--request-rate,
trace timestamps) until --num-requests or --duration; sessions send turn after answer."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import httpx

from kvserve.bench.arrivals import gaps
from kvserve.bench.client import Target, probe
from kvserve.bench.ideal import PrefixTracker
from kvserve.bench.phase import Phase
from kvserve.bench.profiles import Unit
from kvserve.bench.progress import Progress
from kvserve.bench.records import RequestRecord
from kvserve.bench.scrape import Scraper, fetch
from kvserve.bench.tokens import Tokenizer
from kvserve.errors import ConfigError


@dataclass(frozen=True)
class LoadConfig:
    max_concurrency: int | None = None
    request_rate: float = math.inf
    arrival: str = "poisson"
    burstiness: float = 1.0
    num_requests: int | None = 100
    duration_s: float | None = None
    warmup: int = 0
    turn_delay_s: float = 0.0
    seed: int = 0
    scrape_metrics: bool = False
    quiet: bool = False

    def __post_init__(self) -> None:
        if self.num_requests is None and self.duration_s is None:
            raise ConfigError("give --num-requests or --duration")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ConfigError("--max-concurrency must be >= 1")
        if self.num_requests is not None and self.num_requests < 1:
            raise ConfigError("--num-requests must be >= 1")
        if self.warmup < 0 or self.turn_delay_s < 0:
            raise ConfigError("--warmup and --turn-delay must not be negative")


@dataclass
class RunOutcome:
    records: list[RequestRecord]
    model: str
    server: dict | None  # --scrape-metrics summary
    clock_origin: float = 0.0  # perf_counter() at run time 0 (records' times are relative to it)


async def _closed_loop(phase: Phase, units: Iterator[Unit], workers: int, delay_s: float) -> None:
    async def worker() -> None:
        while phase.more():
            unit = next(units, None)
            if unit is None:
                return
            await phase.unit(unit, delay_s)

    await asyncio.gather(*(worker() for _ in range(workers)))


async def _open_loop(phase: Phase, units: Iterator[Unit], load: LoadConfig) -> None:
    """Units start at arrival times (trace timestamps, else the arrival process); a semaphore
    caps concurrency when --max-concurrency is also given."""
    arrivals = gaps(random.Random(load.seed + 1), load.request_rate, load.arrival, load.burstiness)
    sem = asyncio.Semaphore(load.max_concurrency) if load.max_concurrency else None
    tasks: list[asyncio.Task] = []
    next_at = 0.0
    start = time.perf_counter()

    async def limited(unit: Unit) -> None:
        if sem is None:
            return await phase.unit(unit, load.turn_delay_s)
        async with sem:
            await phase.unit(unit, load.turn_delay_s)

    while phase.more():
        unit = next(units, None)
        if unit is None:
            break
        at = unit.at if unit.at is not None else next_at
        next_at += next(arrivals)
        wait = at - (time.perf_counter() - start)
        if wait > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.create_task(limited(unit)))
    await asyncio.gather(*tasks)


async def _phase(phase: Phase, units: Iterator[Unit], load: LoadConfig, open_loop: bool) -> None:
    if open_loop:
        await _open_loop(phase, units, load)
    else:
        workers = load.max_concurrency or load.num_requests or 1
        await _closed_loop(phase, units, workers, load.turn_delay_s)


async def run_async(units: Iterator[Unit], target: Target, tok: Tokenizer, load: LoadConfig,
                    open_loop: bool) -> RunOutcome:  # fmt: skip
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(target.timeout_s, connect=10.0)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=target.headers(),
                                 trust_env=False) as http:  # fmt: skip
        models = await probe(http, target.base_url)
        if target.model == "default" and models:
            target = replace(target, model=models[0])
        t0 = time.perf_counter()
        tracker = PrefixTracker()
        progress = Progress(load.num_requests, load.duration_s, load.quiet)
        records: list[RequestRecord] = []
        if load.warmup:
            warm = Phase(http, target, tok, tracker, Progress(None, quiet=True), t0)
            warm.warmup, warm.remaining = True, load.warmup
            await _closed_loop(warm, units, min(load.warmup, load.max_concurrency or 8), 0.0)
            records += warm.records
        scraper = Scraper(http, target.base_url) if load.scrape_metrics else None
        if scraper:
            scraper.before = await fetch(http, target.base_url)
        phase = Phase(http, target, tok, tracker, progress, t0)
        phase.remaining = load.num_requests
        phase.deadline = (time.perf_counter() - t0 + load.duration_s) if load.duration_s else None
        side = [asyncio.create_task(progress.run(t0))]
        if scraper:
            side.append(asyncio.create_task(scraper.sample_gauges()))
        try:
            await _phase(phase, units, load, open_loop)
        finally:
            for task in side:
                task.cancel()
            await asyncio.gather(*side, return_exceptions=True)
        if scraper:
            scraper.after = await fetch(http, target.base_url)
        for rec in phase.records:
            rec.request_id += len(records)
        records += phase.records
    return RunOutcome(records, target.model, scraper.summary() if scraper else None, t0)


def run(units: Iterator[Unit], target: Target, tok: Tokenizer, load: LoadConfig,
        open_loop: bool) -> RunOutcome:  # fmt: skip
    return asyncio.run(run_async(units, target, tok, load, open_loop))
