"""Forwarding one request: admission, worker choice, the upstream call with retries, and the
relay of the answer (streams passed through chunk by chunk, bytes untouched).

Failure rules: a worker that cannot be reached, times out or answers 5xx counts against its
circuit breaker. Retries (when enabled) happen only before the first byte went to the client.
A stream that breaks after it started ends with an OpenAI error event, never a hang. A client
that goes away closes the upstream connection, which the worker takes as an abort. The whole
request, stream included, is bounded by --request-timeout-secs."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from kvserve.router.admission import Admission, QueueFull, QueueTimeout
from kvserve.router.config import RouterConfig
from kvserve.router.errors import error_response, sse_error
from kvserve.router.metrics import RouterMetrics
from kvserve.router.policies.base import Policy, RouteRequest
from kvserve.router.registry import WorkerRegistry
from kvserve.router.retry import RETRYABLE_STATUSES, backoff_s
from kvserve.router.upstream import Pool, Response, StreamBroken, UpstreamError
from kvserve.router.worker import Worker

log = logging.getLogger("kvserve.router")
_SSE = "text/event-stream"


class _CoalescingStream(web.StreamResponse):
    """A stream whose head leaves with its first body bytes, in one write: a write (a send
    system call, waking the client) less per request, and the first token arrives with the
    head. aiohttp's own `Response` buffers its head the same way (the same class attribute)."""

    _send_headers_immediately = False


class Forwarder:
    def __init__(self, config: RouterConfig, registry: WorkerRegistry, policy: Policy,
                 metrics: RouterMetrics) -> None:  # fmt: skip
        self.config, self.registry, self.policy, self.metrics = config, registry, policy, metrics
        self.admission = Admission(config.queue)
        self.pool = Pool(config.connect_timeout_s)
        # the workers it picks from: "decode" for the non-generation routes of a PD router
        self.role = "decode" if config.pd_disaggregation else "regular"

    async def admit_and_forward(self, request: web.Request, raw: bytes,
                                route: RouteRequest) -> web.StreamResponse:  # fmt: skip
        try:
            waited = await self.admission.acquire()
        except QueueFull:
            self.metrics.rejected["queue_full"] += 1
            return error_response(429, "the router's queue is full; retry later")
        except QueueTimeout:
            self.metrics.rejected["queue_timeout"] += 1
            return error_response(503, "timed out waiting in the router's queue")
        self.metrics.queue_wait.observe(waited)
        try:
            return await self.forward(request, raw, route)
        finally:
            self.admission.release()

    def pick(self, route: RouteRequest, tried: set[str]) -> Worker | None:
        workers = self.registry.routable(self.role)
        if tried:
            workers = [w for w in workers if w.url not in tried] or workers
        return self.policy.select(workers, route) if workers else None

    async def forward(self, request: web.Request, raw: bytes | None,
                      route: RouteRequest) -> web.StreamResponse:  # fmt: skip
        deadline = asyncio.get_running_loop().time() + self.config.request_timeout_s
        tried: set[str] = set()
        attempt, retries = 0, self.config.retry.max_retries
        while True:
            worker = self.pick(route, tried)
            if worker is None:
                self.metrics.rejected["no_worker"] += 1
                return error_response(503, "no healthy worker is available")
            tried.add(worker.url)
            worker.outstanding += 1
            worker.requests += 1
            try:
                up, failure = await self._open(worker, request, raw, deadline)
                retryable = up is None or up.status in RETRYABLE_STATUSES
                if retryable and attempt < retries:
                    if up is not None:
                        self._note_status(worker, up.status)
                        up.close()
                    self.metrics.retries += 1
                    await asyncio.sleep(backoff_s(self.config.retry, attempt))
                    attempt += 1
                    continue
                if up is None:
                    assert failure is not None
                    return error_response(*failure)
                return await self._relay(request, worker, up, deadline)
            finally:
                worker.outstanding -= 1

    async def _open(self, worker: Worker, request: web.Request, raw: bytes | None,
                    deadline: float) -> tuple[Response | None, tuple[int, str] | None]:  # fmt: skip
        """The upstream response once its head arrived, or (status, message) of the failure,
        then counted against the worker's breaker."""
        headers = worker.auth_header
        if raw is not None:
            headers = {**headers, "Content-Type": "application/json"}
        try:
            async with asyncio.timeout_at(deadline):
                up = await self.pool.request(worker.url, request.method, request.path_qs, raw,
                                             headers)  # fmt: skip
            return up, None
        except TimeoutError:
            kind, failure = "timeout", (504, f"worker {worker.url} did not answer in time")
        except UpstreamError as exc:
            kind, failure = exc.kind, (502, f"worker {worker.url} failed: {exc}")
        worker.breaker.record_failure()
        self.metrics.upstream_errors[(worker.url, kind)] += 1
        return None, failure

    def _note_status(self, worker: Worker, status: int) -> None:
        if status >= 500:
            worker.breaker.record_failure()
            self.metrics.upstream_errors[(worker.url, f"http_{status}")] += 1
        else:
            worker.breaker.record_success()

    async def _relay(self, request: web.Request, worker: Worker, up: Response,
                     deadline: float) -> web.StreamResponse:  # fmt: skip
        ctype = up.headers.get("content-type", "application/json")
        try:
            if not ctype.startswith(_SSE):
                try:
                    async with asyncio.timeout_at(deadline):
                        body = await up.read()
                except (StreamBroken, TimeoutError) as exc:
                    worker.breaker.record_failure()
                    return error_response(502, f"worker {worker.url} failed: {exc!r}")
                self._note_status(worker, up.status)
                return web.Response(status=up.status, body=body, headers={"Content-Type": ctype})
            return await self._relay_stream(request, worker, up, ctype, deadline)
        finally:
            up.close()  # no-op once the body was read; else aborts the upstream request

    async def _relay_stream(self, request: web.Request, worker: Worker, up: Response,
                            ctype: str, deadline: float) -> web.StreamResponse:  # fmt: skip
        headers = {"Content-Type": ctype, "Cache-Control": "no-cache"}
        resp = _CoalescingStream(status=up.status, headers=headers)
        try:
            await resp.prepare(request)
            try:
                async with asyncio.timeout_at(deadline):
                    async for data in up.chunks():
                        # the body's last piece and the end of the answer go in one write
                        await (resp.write_eof(data) if up.last else resp.write(data))
            except (StreamBroken, TimeoutError) as exc:
                worker.breaker.record_failure()
                self.metrics.upstream_errors[(worker.url, "stream")] += 1
                log.warning("stream from %s broke: %r", worker.url, exc)
                await resp.write(sse_error(502, f"worker {worker.url} failed mid-stream"))
                return resp
            self._note_status(worker, up.status)
            await resp.write_eof()
        except ConnectionResetError:
            self.metrics.client_disconnects += 1  # up.close() in _relay aborts the worker side
        except asyncio.CancelledError:
            self.metrics.client_disconnects += 1
            raise
        return resp
