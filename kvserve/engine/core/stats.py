"""A snapshot of the engine's gauges and counters, for metrics and logs."""

from __future__ import annotations

import msgspec


class EngineStats(msgspec.Struct):
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # share of KV pages held by requests
    prefix_cache_queries: int  # prompt tokens looked up (monotonic)
    prefix_cache_hits: int  # of those, served from cache (monotonic)
    num_preemptions: int  # monotonic
