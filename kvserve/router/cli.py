"""`kvserve route`: the router process. Flags follow sglang-router's names where it has one.

    kvserve route --worker-urls http://127.0.0.1:8001 http://127.0.0.1:8002 --port 30000

Prints `listening on http://HOST:PORT` once it accepts connections; SIGTERM/SIGINT stop it
(exit 0). Bad flags or a bad worker list: one line, exit code 2."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from aiohttp import web

from kvserve.errors import ConfigError
from kvserve.router.app import create_app
from kvserve.router.config import (
    POLICIES,
    BreakerConfig,
    CacheAwareConfig,
    HealthConfig,
    QueueConfig,
    RetryConfig,
    RouterConfig,
)
from kvserve.router.state import RouterState


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise ConfigError(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kvserve route", description="Route OpenAI requests over N workers.")
    g = p.add_argument_group("workers")
    g.add_argument("--worker-urls", nargs="+", default=[], metavar="URL")
    g.add_argument("--worker-api-key", default=None, help="key the router sends to --worker-urls")
    g.add_argument("--worker-file", default=None,
                   help="JSON/YAML/text list of workers, re-read when it changes")  # fmt: skip
    g.add_argument("--worker-file-poll-secs", type=float, default=2.0)
    g = p.add_argument_group("prefill/decode disaggregation")
    g.add_argument(
        "--pd-disaggregation",
        "--pd",
        action="store_true",
        help="route each request to a prefill worker, then a decode worker",
    )
    g.add_argument(
        "--prefill",
        nargs="+",
        action="append",
        default=[],
        metavar="URL",
        help="a prefill worker (repeat the flag; a bootstrap port after the URL is "
        "accepted and ignored: the worker names its own)",
    )
    g.add_argument(
        "--decode",
        action="append",
        default=[],
        metavar="URL",
        help="a decode worker (repeat the flag)",
    )
    g.add_argument("--prefill-policy", choices=POLICIES, default="round_robin")
    g.add_argument("--decode-policy", choices=POLICIES, default="round_robin")
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=30000)
    g.add_argument("--api-key", default=None, help="clients must send Authorization: Bearer KEY")
    g.add_argument("--policy", choices=POLICIES, default="cache_aware")
    g.add_argument("--request-timeout-secs", type=float, default=2400.0)
    g.add_argument("--connect-timeout-secs", type=float, default=10.0)
    g.add_argument("--max-payload-size", type=int, default=32 << 20, help="bytes")
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    _hardening_flags(p)
    g = p.add_argument_group("cache-aware policy")
    g.add_argument("--cache-threshold", type=float, default=0.3)
    g.add_argument("--balance-abs-threshold", type=int, default=64)
    g.add_argument("--balance-rel-threshold", type=float, default=1.5)
    g.add_argument("--eviction-interval-secs", type=float, default=120.0)
    g.add_argument("--max-tree-size", type=int, default=1 << 24)
    return p


def _hardening_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("health checks")
    g.add_argument("--health-check-interval-secs", type=float, default=10.0)
    g.add_argument("--health-check-timeout-secs", type=float, default=5.0)
    g.add_argument("--health-failure-threshold", type=int, default=3)
    g.add_argument("--health-success-threshold", type=int, default=2)
    g.add_argument("--health-check-endpoint", default="/health")
    g = p.add_argument_group("circuit breaker")
    g.add_argument("--cb-failure-threshold", type=int, default=5)
    g.add_argument("--cb-success-threshold", type=int, default=2)
    g.add_argument("--cb-timeout-duration-secs", type=float, default=30.0)
    g.add_argument("--cb-window-duration-secs", type=float, default=60.0)
    g.add_argument("--disable-circuit-breaker", action="store_true")
    g = p.add_argument_group("retries (off by default)")
    g.add_argument("--retry-max-retries", type=int, default=0, help="> 0 turns retries on")
    g.add_argument("--retry-initial-backoff-ms", type=float, default=50.0)
    g.add_argument("--retry-max-backoff-ms", type=float, default=5000.0)
    g.add_argument("--retry-backoff-multiplier", type=float, default=2.0)
    g.add_argument("--retry-jitter-factor", type=float, default=0.1)
    g.add_argument("--disable-retries", action="store_true", help="the default; forces 0 retries")
    g = p.add_argument_group("queue")
    g.add_argument("--max-concurrent-requests", type=int, default=1024)
    g.add_argument("--queue-size", type=int, default=1024)
    g.add_argument("--queue-timeout-secs", type=float, default=60.0)


def build_config(a: argparse.Namespace) -> RouterConfig:
    health = HealthConfig(a.health_check_interval_secs, a.health_check_timeout_secs,
                          a.health_failure_threshold, a.health_success_threshold,
                          a.health_check_endpoint)  # fmt: skip
    breaker = BreakerConfig(not a.disable_circuit_breaker, a.cb_failure_threshold,
                            a.cb_success_threshold, a.cb_timeout_duration_secs,
                            a.cb_window_duration_secs)  # fmt: skip
    retry = RetryConfig(0 if a.disable_retries else a.retry_max_retries,
                        a.retry_initial_backoff_ms / 1000, a.retry_max_backoff_ms / 1000,
                        a.retry_backoff_multiplier, a.retry_jitter_factor)  # fmt: skip
    queue = QueueConfig(a.max_concurrent_requests, a.queue_size, a.queue_timeout_secs)
    cache = CacheAwareConfig(a.cache_threshold, a.balance_abs_threshold, a.balance_rel_threshold,
                             a.eviction_interval_secs, a.max_tree_size)  # fmt: skip
    return RouterConfig(
        worker_urls=tuple(a.worker_urls), worker_api_key=a.worker_api_key,
        pd_disaggregation=a.pd_disaggregation, prefill_urls=tuple(p[0] for p in a.prefill),
        decode_urls=tuple(a.decode), prefill_policy=a.prefill_policy,
        decode_policy=a.decode_policy,
        worker_file=a.worker_file, worker_file_poll_s=a.worker_file_poll_secs, host=a.host,
        port=a.port, policy=a.policy, api_key=a.api_key,
        request_timeout_s=a.request_timeout_secs, connect_timeout_s=a.connect_timeout_secs,
        max_payload_size=a.max_payload_size, health=health, breaker=breaker, retry=retry,
        queue=queue, cache_aware=cache,
    )  # fmt: skip


async def serve(state: RouterState) -> None:
    runner = web.AppRunner(create_app(state), handler_cancellation=True, access_log=None,
                           shutdown_timeout=5.0)  # fmt: skip
    await runner.setup()
    try:
        site = web.TCPSite(runner, state.config.host, state.config.port, backlog=4096)
        await site.start()
        host, port = runner.addresses[0][:2]
        print(f"listening on http://{host}:{port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    config = build_config(args)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    state = RouterState(config)
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    try:
        run(serve(state))
    except OSError as exc:
        raise ConfigError(f"cannot serve on {config.host}:{config.port}: {exc.strerror}") from None
    return 0
