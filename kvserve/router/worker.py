"""One upstream worker as the router sees it: where it is, its own API key, its role (regular,
or prefill/decode for PD pairs), whether it is draining, its outstanding requests, its health
and its circuit breaker."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from kvserve.errors import ConfigError
from kvserve.router.breaker import CircuitBreaker
from kvserve.router.config import BreakerConfig

ROLES = ("regular", "prefill", "decode")


@dataclass(frozen=True)
class WorkerSpec:
    url: str
    api_key: str | None = None
    role: str = "regular"
    draining: bool = False


def normalize_url(url: str) -> str:
    """`host:port` or `http(s)://host:port[/]` -> `http(s)://host:port`; a clear error else."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"worker URL {url!r} is not http(s)://host:port")
    try:
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError as exc:
        raise ConfigError(f"worker URL {url!r}: {exc}") from None
    if parts.path.strip("/") or parts.query:
        raise ConfigError(f"worker URL {url!r} must not have a path or query")
    return f"{parts.scheme}://{parts.netloc}"


def make_spec(url: str, api_key: str | None = None, role: str = "regular",
              draining: bool = False) -> WorkerSpec:  # fmt: skip
    if role not in ROLES:
        raise ConfigError(f"worker role {role!r} is not one of {', '.join(ROLES)}")
    if api_key is not None and not isinstance(api_key, str):
        raise ConfigError("worker api_key must be a string")
    return WorkerSpec(normalize_url(url), api_key or None, role, bool(draining))


@dataclass(eq=False)
class Worker:
    spec: WorkerSpec
    breaker: CircuitBreaker
    source: str = "cli"  # cli | file | api: the worker file only manages its own
    healthy: bool = False  # until the first health check passes
    outstanding: int = 0
    requests: int = 0
    health_failures: int = 0
    health_successes: int = 0
    checked: bool = False
    auth_header: dict[str, str] = field(default_factory=dict)

    @classmethod
    def create(cls, spec: WorkerSpec, breaker: BreakerConfig, source: str) -> Worker:
        worker = cls(spec, CircuitBreaker(breaker), source)
        worker.update(spec)
        return worker

    def update(self, spec: WorkerSpec) -> None:
        self.spec = spec
        key = spec.api_key
        self.auth_header = {"Authorization": f"Bearer {key}"} if key else {}

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def routable(self) -> bool:
        return self.healthy and not self.spec.draining and self.breaker.allows()

    def describe(self) -> dict[str, object]:
        return {"url": self.url, "role": self.spec.role, "source": self.source,
                "is_healthy": self.healthy, "draining": self.spec.draining,
                "load": self.outstanding, "requests": self.requests,
                "circuit_breaker": self.breaker.state,
                "has_api_key": self.spec.api_key is not None}  # fmt: skip
