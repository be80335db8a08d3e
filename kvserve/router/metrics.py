"""`/metrics` in the Prometheus text format, `kvserve_router:` names. Counters are plain ints
bumped on the hot path; per-worker gauges are read from the registry when scraped, so a
removed worker simply disappears from the next scrape."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from kvserve.router.admission import Admission
from kvserve.router.breaker import STATE_CODES
from kvserve.router.registry import WorkerRegistry

P = "kvserve_router:"
REJECT_REASONS = ("queue_full", "queue_timeout", "no_worker")
_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total, self.n = 0.0, 0

    def observe(self, value: float) -> None:
        self.total += value
        self.n += 1
        for i, edge in enumerate(self.buckets):
            if value <= edge:
                self.counts[i] += 1
                break

    def lines(self, name: str) -> Iterable[str]:
        running = 0
        for edge, count in zip(self.buckets, self.counts):
            running += count
            yield f'{name}_bucket{{le="{edge}"}} {running}'
        yield f'{name}_bucket{{le="+Inf"}} {self.n}'
        yield f"{name}_sum {self.total}"
        yield f"{name}_count {self.n}"


class RouterMetrics:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()  # (path, status)
        self.retries = 0
        self.rejected: Counter[str] = Counter(dict.fromkeys(REJECT_REASONS, 0))
        self.upstream_errors: Counter[tuple[str, str]] = Counter()  # (worker, kind)
        self.client_disconnects = 0
        self.queue_wait = Histogram(_WAIT_BUCKETS)

    def render(self, registry: WorkerRegistry, admission: Admission) -> bytes:
        out = [f"# TYPE {P}requests_total counter"]
        out += [f'{P}requests_total{{path="{_label(path)}",status="{status}"}} {n}'
                for (path, status), n in sorted(self.requests.items())]  # fmt: skip
        out += [f"# TYPE {P}retries_total counter", f"{P}retries_total {self.retries}"]
        out += [f"# TYPE {P}rejected_total counter"]
        out += [f'{P}rejected_total{{reason="{r}"}} {n}' for r, n in sorted(self.rejected.items())]
        out += [f"# TYPE {P}upstream_errors_total counter"]
        out += [f'{P}upstream_errors_total{{worker="{_label(w)}",kind="{k}"}} {n}'
                for (w, k), n in sorted(self.upstream_errors.items())]  # fmt: skip
        out += [f"# TYPE {P}client_disconnects_total counter",
                f"{P}client_disconnects_total {self.client_disconnects}"]  # fmt: skip
        out += [f"# TYPE {P}queue_depth gauge", f"{P}queue_depth {admission.depth}"]
        out += [f"# TYPE {P}running_requests gauge", f"{P}running_requests {admission.running}"]
        out += [f"# TYPE {P}queue_wait_seconds histogram"]
        out += list(self.queue_wait.lines(f"{P}queue_wait_seconds"))
        out += list(_worker_lines(registry))
        return ("\n".join(out) + "\n").encode()


def _worker_lines(registry: WorkerRegistry) -> Iterable[str]:
    workers = list(registry.workers.values())
    gauges = {
        "worker_outstanding_requests": lambda w: w.outstanding,
        "worker_healthy": lambda w: int(w.healthy),
        "worker_draining": lambda w: int(w.spec.draining),
        "worker_breaker_state": lambda w: STATE_CODES[w.breaker.state],
    }
    for name, value in gauges.items():
        yield f"# TYPE {P}{name} gauge"
        for w in workers:
            yield f'{P}{name}{{worker="{_label(w.url)}",role="{w.spec.role}"}} {value(w)}'
    yield f"# TYPE {P}worker_requests_total counter"
    for w in workers:
        yield f'{P}worker_requests_total{{worker="{_label(w.url)}"}} {w.requests}'
    yield f"# TYPE {P}worker_breaker_transitions_total counter"
    for w in workers:
        label = _label(w.url)
        yield f'{P}worker_breaker_transitions_total{{worker="{label}"}} {w.breaker.transitions}'
    yield f"# TYPE {P}workers gauge"
    yield f"{P}workers {len(workers)}"
