"""The router's settings as frozen dataclasses, validated once; `cli.py` maps flags onto them.
Names and defaults follow sglang-router's flags where one exists; where the field's runs differ
(retries off, 2400 s request timeouts) the field's choice is the default."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvserve.errors import ConfigError

POLICIES = ("round_robin", "least_outstanding", "cache_aware", "random")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class HealthConfig:
    interval_s: float = 10.0
    timeout_s: float = 5.0
    failure_threshold: int = 3
    success_threshold: int = 2
    endpoint: str = "/health"

    def __post_init__(self) -> None:
        _check(self.interval_s > 0, "--health-check-interval-secs must be > 0")
        _check(self.timeout_s > 0, "--health-check-timeout-secs must be > 0")
        _check(self.failure_threshold >= 1, "--health-failure-threshold must be >= 1")
        _check(self.success_threshold >= 1, "--health-success-threshold must be >= 1")
        _check(self.endpoint.startswith("/"), "--health-check-endpoint must start with /")


@dataclass(frozen=True)
class BreakerConfig:
    enabled: bool = True
    failure_threshold: int = 5
    success_threshold: int = 2
    open_duration_s: float = 30.0  # sglang: --cb-timeout-duration-secs
    window_s: float = 60.0

    def __post_init__(self) -> None:
        _check(self.failure_threshold >= 1, "--cb-failure-threshold must be >= 1")
        _check(self.success_threshold >= 1, "--cb-success-threshold must be >= 1")
        _check(self.open_duration_s > 0, "--cb-timeout-duration-secs must be > 0")
        _check(self.window_s > 0, "--cb-window-duration-secs must be > 0")


@dataclass(frozen=True)
class RetryConfig:
    max_retries: int = 0  # off, as the field runs; > 0 turns retries on
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        _check(self.max_retries >= 0, "--retry-max-retries must be >= 0")
        _check(self.initial_backoff_s >= 0, "--retry-initial-backoff-ms must be >= 0")
        _check(self.max_backoff_s >= self.initial_backoff_s,
               "--retry-max-backoff-ms must be >= --retry-initial-backoff-ms")  # fmt: skip
        _check(self.multiplier >= 1.0, "--retry-backoff-multiplier must be >= 1")
        _check(0.0 <= self.jitter <= 1.0, "--retry-jitter-factor must be in [0, 1]")


@dataclass(frozen=True)
class QueueConfig:
    max_concurrent: int = 1024  # requests forwarded at once; beyond that they queue
    size: int = 1024  # queued requests; beyond that: 429
    timeout_s: float = 60.0  # queued longer: 503

    def __post_init__(self) -> None:
        _check(self.max_concurrent >= 1, "--max-concurrent-requests must be >= 1")
        _check(self.size >= 0, "--queue-size must be >= 0")
        _check(self.timeout_s > 0, "--queue-timeout-secs must be > 0")


@dataclass(frozen=True)
class CacheAwareConfig:
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    eviction_interval_s: float = 120.0
    max_tree_size: int = 1 << 24  # characters (or tokens) kept per worker's tree

    def __post_init__(self) -> None:
        _check(0.0 <= self.cache_threshold <= 1.0, "--cache-threshold must be in [0, 1]")
        _check(self.balance_abs_threshold >= 0, "--balance-abs-threshold must be >= 0")
        _check(self.balance_rel_threshold >= 1.0, "--balance-rel-threshold must be >= 1")
        _check(self.eviction_interval_s > 0, "--eviction-interval-secs must be > 0")
        _check(self.max_tree_size >= 1, "--max-tree-size must be >= 1")


@dataclass(frozen=True)
class RouterConfig:
    worker_urls: tuple[str, ...] = ()
    # Prefill/decode disaggregation (sglang-router: --pd-disaggregation --prefill --decode)
    pd_disaggregation: bool = False
    prefill_urls: tuple[str, ...] = ()
    decode_urls: tuple[str, ...] = ()
    prefill_policy: str = "round_robin"
    decode_policy: str = "round_robin"
    worker_api_key: str | None = None  # sent to the workers given on the command line
    worker_file: str | None = None
    worker_file_poll_s: float = 2.0
    host: str = "127.0.0.1"
    port: int = 30000
    policy: str = "cache_aware"
    api_key: str | None = None
    request_timeout_s: float = 2400.0
    connect_timeout_s: float = 10.0
    max_payload_size: int = 32 << 20
    health: HealthConfig = field(default_factory=HealthConfig)
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    retry: RetryConfig = field(default_factory=RetryConfig)
    queue: QueueConfig = field(default_factory=QueueConfig)
    cache_aware: CacheAwareConfig = field(default_factory=CacheAwareConfig)

    def __post_init__(self) -> None:
        _check(self.policy in POLICIES, f"--policy must be one of {', '.join(POLICIES)}")
        workers = self.worker_urls or self.prefill_urls or self.decode_urls
        _check(bool(workers) or self.worker_file is not None,
               "give workers with --worker-urls or --worker-file (or --prefill, --decode)"
               )  # fmt: skip
        _check(self.pd_disaggregation or not (self.prefill_urls or self.decode_urls),
               "--prefill and --decode need --pd-disaggregation")  # fmt: skip
        for flag, name in (("--prefill-policy", self.prefill_policy),
                           ("--decode-policy", self.decode_policy)):  # fmt: skip
            _check(name in POLICIES, f"{flag} must be one of {', '.join(POLICIES)}")
        _check(self.request_timeout_s > 0, "--request-timeout-secs must be > 0")
        _check(self.connect_timeout_s > 0, "--connect-timeout-secs must be > 0")
        _check(self.worker_file_poll_s > 0, "--worker-file-poll-secs must be > 0")
        _check(0 <= self.port < 65536, "--port must be in 0..65535")
        _check(self.max_payload_size >= 1024, "--max-payload-size must be >= 1024 bytes")
        _check(self.api_key != "", "--api-key must not be empty")
