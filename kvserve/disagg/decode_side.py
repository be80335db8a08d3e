"""The decode engine's side: fetch a request's KV from its prefill worker in a background
thread (into host memory, holding no page meanwhile), then, on the engine thread, take pages,
import the KV and put the request in the running batch with its first token known.

A fetch that fails or outlives ``--disaggregation-transfer-timeout`` fails the request; so does
fetched KV that finds no free pages within that time. Either way no page stays held."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from typing import TYPE_CHECKING

from kvserve.config import DisaggConfig
from kvserve.disagg.blob import PrefilledKV
from kvserve.disagg.bootstrap import fetch
from kvserve.disagg.framing import TransferError
from kvserve.disagg.handle import RemotePrefill
from kvserve.disagg.hooks import EngineHook
from kvserve.disagg.staging import copies_done_event, staging_for_pool
from kvserve.disagg.transfer import make_transport
from kvserve.engine.core.outputs import EngineCoreOutput
from kvserve.engine.core.request import Request
from kvserve.engine.runner.kv_pool import KVPool

if TYPE_CHECKING:
    from kvserve.engine.engine_core import EngineCore

log = logging.getLogger("kvserve.disagg")
IDLE_WAIT_S = 0.01  # how long poll() sleeps for a fetch when nothing else runs


class DecodeSide(EngineHook):
    mode = "decode"

    def __init__(self, config: DisaggConfig, engine: EngineCore) -> None:
        self.engine = engine
        self.timeout_s = config.disaggregation_transfer_timeout
        self.staging = staging_for_pool(
            config.disaggregation_staging_gb, engine.runner.kv, engine.context_length
        )
        self.transport = make_transport(config.disaggregation_transfer_backend, self.staging)
        self.pending: dict[str, Request] = {}  # fetching, or fetched and waiting for pages
        self.fetched: queue.Queue[tuple[Request, PrefilledKV | Exception]] = queue.Queue()
        self.ready: list[tuple[Request, PrefilledKV, float]] = []  # with a deadline for pages
        self.failed: list[tuple[str, str]] = []

    @property
    def num_pending(self) -> int:
        return len(self.pending)

    def add(self, request: Request, remote: RemotePrefill) -> None:
        if remote.backend != self.transport.name:
            raise ValueError(f"the prefill worker transfers with {remote.backend}; this decode "
                             f"worker with {self.transport.name}")  # fmt: skip
        self.pending[request.request_id] = request
        threading.Thread(target=self._fetch, args=(request, remote), daemon=True,
                         name="kvserve-kv-fetch").start()  # fmt: skip

    def _fetch(self, request: Request, remote: RemotePrefill) -> None:
        started = time.perf_counter()
        result: PrefilledKV | Exception
        try:
            blob = fetch(remote.host, remote.port, remote.room, self.transport, self.timeout_s)
            blob.seconds["fetched_at"] = time.monotonic()
            _log_fetched(remote, blob, time.perf_counter() - started, self.transport.name)
            result = blob
        except Exception as exc:  # any failure must reach the engine thread, not kill this one
            result = exc
        self.fetched.put((request, result))

    def abort(self, request_id: str) -> bool:
        """The fetched pages of an aborted request are given back when poll() meets them."""
        return self.pending.pop(request_id, None) is not None

    def take_failed(self) -> list[tuple[str, str]]:
        failed, self.failed = self.failed, []
        return failed

    def poll(self) -> list[EngineCoreOutput]:
        if self.pending and not self.engine.scheduler.has_unfinished():
            # nothing else to do: wait briefly instead of spinning the engine loop
            with contextlib.suppress(queue.Empty):
                self._arrived(*self.fetched.get(timeout=IDLE_WAIT_S))
        while True:
            try:
                self._arrived(*self.fetched.get_nowait())
            except queue.Empty:
                break
        outputs, waiting = [], []
        for req, blob, deadline in self.ready:
            if req.request_id not in self.pending:
                blob.release()  # aborted while it waited for pages
                continue
            out = self._admit(req, blob)
            if out is not None:
                outputs.append(out)
            elif req.request_id not in self.pending:
                blob.release()  # failed
                continue
            elif time.monotonic() > deadline:
                self._fail(req, "no room in the batch for the prompt within the transfer timeout")
                blob.release()
            else:
                waiting.append((req, blob, deadline))
        self.ready = waiting
        return outputs

    def _arrived(self, req: Request, result: PrefilledKV | Exception) -> None:
        if isinstance(result, Exception):
            if req.request_id in self.pending:
                why = str(result) if isinstance(result, TransferError) else repr(result)
                self._fail(req, f"KV transfer failed: {why}")
            return
        if req.request_id not in self.pending:
            result.release()  # aborted while fetching
            return
        problem = _mismatch(req, result, self.engine.runner.kv)
        if problem:
            self._fail(req, problem)
            result.release()
            return
        self.ready.append((req, result, time.monotonic() + self.timeout_s))

    def _fail(self, req: Request, why: str) -> None:
        log.warning("request %s: %s", req.request_id, why)
        self.pending.pop(req.request_id, None)
        self.engine.requests.pop(req.request_id, None)
        self.failed.append((req.request_id, why))

    def _admit(self, req: Request, blob: PrefilledKV) -> EngineCoreOutput | None:
        """Pages, import, join the batch; None when the batch or the pool has no room yet."""
        kv, pool = self.engine.kv, self.engine.runner.kv
        if not self.engine.scheduler.has_room_for(req):
            return None
        pages = kv.allocate(blob.header.shape[2])
        if pages is None:
            return None
        started = time.perf_counter()
        try:
            pool.import_pages(pages, blob.pages)
        except ValueError as exc:
            kv.release(pages)
            self._fail(req, f"the prefill worker's KV does not fit this pool: {exc}")
            return None
        blob.release(copies_done_event(pool.device))
        _log_imported(req.request_id, blob, time.perf_counter() - started)
        del self.pending[req.request_id]
        h = blob.header
        req.output_token_ids.append(h.first_token_id)
        req.block_table, req.num_computed_tokens = pages, req.num_prompt_tokens
        req.admitted, req.num_cached_tokens = True, h.num_cached_tokens
        req.first_scheduled_time = time.monotonic()
        self.engine.scheduler.add_prefilled(req)
        finish = req.finish_reason.value if req.finish_reason is not None else None
        if finish is not None:
            self.engine.requests.pop(req.request_id, None)
        lps = [h.first_logprob] if req.params.logprobs is not None and h.first_logprob else None
        return EngineCoreOutput(req.request_id, [h.first_token_id], lps, finish, req.stop_reason,
                                req.num_prompt_tokens, h.num_cached_tokens)  # fmt: skip


# benchmarks/pd_serving.py reads these two lines: the decode side's time per request
def _log_fetched(remote: RemotePrefill, blob: PrefilledKV, seconds: float, backend: str) -> None:
    size, s = blob.header.nbytes, blob.seconds
    log.info("kv transfer %s: %d bytes in %.6f s (%.3f GB/s, %s; header %.6f s, wire %.6f s)",
             remote.room, size, seconds, size / max(seconds, 1e-9) / 1e9, backend,
             s.get("header", 0.0), s.get("wire", 0.0))  # fmt: skip


def _log_imported(request_id: str, blob: PrefilledKV, seconds: float) -> None:
    waited = time.monotonic() - blob.seconds.get("fetched_at", time.monotonic()) - seconds
    log.info("kv import %s: %d bytes, waited %.6f s for the engine and pages, import %.6f s "
             "(engine thread)", blob.header.room, blob.header.nbytes, max(waited, 0.0),
             seconds)  # fmt: skip


def _mismatch(req: Request, blob: PrefilledKV, pool: KVPool) -> str:
    """Why fetched KV cannot serve this request ("" when it can)."""
    h = blob.header
    if h.prompt_token_ids != req.prompt_token_ids:
        return ("the prefill worker's prompt tokens differ from this worker's: the two must "
                "serve the same model and tokenizer")  # fmt: skip
    if h.shape[2] != pool.pages_for(req.num_prompt_tokens):
        return f"the prefill worker sent {h.shape[2]} pages for {req.num_prompt_tokens} tokens"
    if h.k_scales != pool.k_scales.tolist() or h.v_scales != pool.v_scales.tolist():
        return "the prefill worker's KV scales differ from this worker's"
    return ""
