"""Forwarding one request to a prefill/decode pair (``kvserve route --pd-disaggregation``).

    1. the prefill worker gets the body with streaming off; its answer (one token, usage) carries
       ``kv_transfer_params``: where its KV waits (see kvserve/disagg/__init__.py)
    2. the decode worker gets the body plus those ``kv_transfer_params``; it fetches the KV and
       its answer (stream or not) goes to the client exactly as the plain forwarder relays it

A prefill that cannot be reached, times out or answers 5xx / 429 fails the request with an
OpenAI error, or, with retries on, the request starts over on another pair (nothing has
reached the client yet). Its 4xx answers (a bad request) go to the client as they are. A
client that hangs up closes the open upstream connection, prefill or decode: the worker aborts."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
from aiohttp import web

from kvserve.router.config import RouterConfig
from kvserve.router.errors import error_response
from kvserve.router.metrics import RouterMetrics
from kvserve.router.policies.base import Policy, RouteRequest
from kvserve.router.policies.pd_pairing import PDPairPolicy, select_pd_pair
from kvserve.router.proxy import Forwarder
from kvserve.router.registry import WorkerRegistry
from kvserve.router.retry import RETRYABLE_STATUSES, backoff_s
from kvserve.router.upstream import StreamBroken
from kvserve.router.worker import Worker

FIELD = "kv_transfer_params"


class PairFailed(Exception):
    """A worker of the pair failed before anything reached the client."""

    def __init__(self, worker: Worker, response: web.Response, retryable: bool) -> None:
        self.worker, self.response, self.retryable = worker, response, retryable


class PDForwarder(Forwarder):
    def __init__(self, config: RouterConfig, registry: WorkerRegistry, policy: Policy,
                 pair_policy: PDPairPolicy, metrics: RouterMetrics) -> None:  # fmt: skip
        super().__init__(config, registry, policy, metrics)
        self.pair_policy = pair_policy

    def pick_pair(self, route: RouteRequest, tried: set[str]) -> tuple[Worker, Worker] | None:
        workers = list(self.registry.workers.values())  # select_pd_pair keeps the routable
        fresh = [w for w in workers if w.url not in tried]
        return select_pd_pair(fresh, self.pair_policy, route) or select_pd_pair(
            workers, self.pair_policy, route
        )

    async def forward(self, request: web.Request, raw: bytes | None,
                      route: RouteRequest) -> web.StreamResponse:  # fmt: skip
        """Generation requests only (the app sends the rest to a plain ``Forwarder``)."""
        body = route.body or {}
        deadline = asyncio.get_running_loop().time() + self.config.request_timeout_s
        tried: set[str] = set()
        attempt, retries = 0, self.config.retry.max_retries
        while True:
            pair = self.pick_pair(route, tried)
            if pair is None:
                self.metrics.rejected["no_worker"] += 1
                return error_response(503, "no healthy prefill/decode pair is available")
            prefill, decode = pair
            try:
                params = await self._prefill(prefill, request, body, deadline)
                to_decode = msgspec.json.encode({**body, FIELD: params})
                return await self._decode(decode, request, to_decode, deadline, attempt < retries)
            except PairFailed as failed:
                if not failed.retryable or attempt >= retries:
                    return failed.response
                tried.add(failed.worker.url)
                self.metrics.retries += 1
                await asyncio.sleep(backoff_s(self.config.retry, attempt))
                attempt += 1

    async def _prefill(self, worker: Worker, request: web.Request, body: dict[str, Any],
                       deadline: float) -> dict[str, Any]:  # fmt: skip
        """The prefill worker's ``kv_transfer_params``; PairFailed otherwise."""
        ask = {k: v for k, v in body.items() if k != "stream_options"}
        ask["stream"] = False
        worker.outstanding += 1
        worker.requests += 1
        try:
            up, failure = await self._open(worker, request, json.dumps(ask).encode(), deadline)
            if up is None:
                assert failure is not None
                raise PairFailed(worker, error_response(*failure), True)
            try:
                async with asyncio.timeout_at(deadline):
                    data = await up.read()
            except (StreamBroken, TimeoutError) as exc:
                worker.breaker.record_failure()
                failed = error_response(502, f"prefill worker {worker.url} failed: {exc!r}")
                raise PairFailed(worker, failed, True) from None
            finally:
                up.close()
            self._note_status(worker, up.status)
            if up.status != 200:
                passed = web.Response(status=up.status, body=data,
                                      headers={"Content-Type": "application/json"})  # fmt: skip
                retryable = up.status in RETRYABLE_STATUSES or up.status >= 500
                raise PairFailed(worker, passed, retryable)
            return _transfer_params(worker, data)
        finally:
            worker.outstanding -= 1

    async def _decode(self, worker: Worker, request: web.Request, raw: bytes, deadline: float,
                      may_retry: bool) -> web.StreamResponse:  # fmt: skip
        worker.outstanding += 1
        worker.requests += 1
        try:
            up, failure = await self._open(worker, request, raw, deadline)
            if up is None:
                assert failure is not None
                raise PairFailed(worker, error_response(*failure), True)
            if may_retry and up.status in RETRYABLE_STATUSES:
                self._note_status(worker, up.status)
                up.close()
                raise PairFailed(worker, error_response(up.status, "decode worker busy"), True)
            return await self._relay(request, worker, up, deadline)
        finally:
            worker.outstanding -= 1


def _transfer_params(worker: Worker, data: bytes) -> dict[str, Any]:
    try:
        params = json.loads(data).get(FIELD)
    except (ValueError, AttributeError):
        params = None
    if not isinstance(params, dict):
        failed = error_response(502, f"worker {worker.url} answered without {FIELD}: is it "
                                "started with --disaggregation-mode prefill?")  # fmt: skip
        raise PairFailed(worker, failed, False)
    return params
