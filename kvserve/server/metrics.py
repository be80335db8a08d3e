"""Prometheus metrics at ``/metrics`` (own registry, ``kvserve:`` prefix, vLLM's names).

Gauges and the prefix-cache/preemption counters follow the engine's stats snapshots; token
counts, finish reasons and latencies are observed per request in the API process. Counters
are declared without ``_total``: prometheus_client appends it when exposing."""

from __future__ import annotations

import prometheus_client as prom
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvserve.engine.core.stats import EngineStats
from kvserve.engine.ipc.messages import OutputBatch, Ready

prom.disable_created_metrics()

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)  # fmt: skip
_ITL_BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)  # fmt: skip


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        r, labels = self.registry, ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"kvserve:{name}", doc, labels, registry=r).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"kvserve:{name}", doc, labels, registry=r).labels(model_name)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"kvserve:{name}", doc, labels, buckets=buckets, registry=r).labels(
                model_name
            )

        self.running = gauge("num_requests_running", "Requests in the running batch")
        self.waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled")
        self.kv_usage = gauge("kv_cache_usage_perc", "Share of KV pages held (1 = full)")
        # the admission ledger: admitted = running + waiting + preparing once nothing is in
        # transit (tests check it after every fault)
        self.admitted = gauge("num_requests_admitted", "Engine requests admitted, not done")
        self.preparing = gauge("num_requests_preparing", "Admitted, not yet sent to the engine")
        self.in_transit = gauge("num_messages_in_transit", "Sent to the engine, not yet handled")
        self.cache_queries = counter("prefix_cache_queries", "Prompt tokens looked up")
        self.cache_hits = counter("prefix_cache_hits", "Prompt tokens served from the cache")
        self.prompt_tokens = counter("prompt_tokens", "Prefill tokens processed")
        self.generation_tokens = counter("generation_tokens", "Generated tokens")
        self.preemptions = counter("num_preemptions", "Preemptions")
        self._success = Counter(
            "kvserve:request_success", "Finished requests by finish reason",
            ["model_name", "finished_reason"], registry=r,
        )  # fmt: skip
        self.model_name = model_name
        self.ttft = histogram("time_to_first_token_seconds", "TTFT", _LATENCY_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Inter-token latency", _ITL_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "End-to-end latency", _LATENCY_BUCKETS)
        self.queue_time = histogram("request_queue_time_seconds", "Time waiting", _LATENCY_BUCKETS)
        self._last = EngineStats(0, 0, 0.0, 0, 0, 0)

    def set_cache_config(self, ready: Ready) -> None:
        """The KV pool as the engine built it (vLLM's cache_config_info, plus its capacity)."""
        info = Gauge(
            "kvserve:cache_config_info", "KV cache configuration (labels); value 1",
            ["model_name", "cache_dtype", "page_size", "num_pages"], registry=self.registry,
        )  # fmt: skip
        info.labels(
            self.model_name, ready.kv_cache_dtype, str(ready.page_size), str(ready.num_pages)
        ).set(1)
        capacity = Gauge(
            "kvserve:kv_cache_capacity_tokens", "Tokens the KV pool holds",
            ["model_name"], registry=self.registry,
        )  # fmt: skip
        capacity.labels(self.model_name).set(ready.num_pages * ready.page_size)
        per_token = Gauge(
            "kvserve:kv_cache_bytes_per_token", "KV bytes per token over all layers",
            ["model_name"], registry=self.registry,
        )  # fmt: skip
        per_token.labels(self.model_name).set(ready.kv_bytes_per_token)

    def on_batch(self, batch: OutputBatch) -> None:
        s, last = batch.stats, self._last
        self.running.set(s.num_running)
        self.waiting.set(s.num_waiting)
        self.kv_usage.set(s.kv_cache_usage)
        self.cache_queries.inc(s.prefix_cache_queries - last.prefix_cache_queries)
        self.cache_hits.inc(s.prefix_cache_hits - last.prefix_cache_hits)
        self.preemptions.inc(s.num_preemptions - last.num_preemptions)
        self._last = s
        for out in batch.outputs:
            self.generation_tokens.inc(len(out.new_token_ids))
        for seconds in batch.queue_times.values():
            self.queue_time.observe(seconds)

    def request_finished(self, reason: str, prompt_tokens: int) -> None:
        self._success.labels(self.model_name, reason).inc()
        self.prompt_tokens.inc(prompt_tokens)

    def on_admission(self, admitted: int, preparing: int, in_transit: int) -> None:
        self.admitted.set(admitted)
        self.preparing.set(preparing)
        self.in_transit.set(in_transit)

    def render(self) -> bytes:
        return prom.generate_latest(self.registry)
