"""Continuous-batching scheduler: bookkeeping only, it never touches a tensor.

One rule: each step gives every running request tokens so that its computed tokens catch up
with its known tokens (``num_tokens``, plus a token still being sampled by a launched step),
within the step's token budget and the per-request chunk size. That covers prefill, chunked
prefill, prefix-cache hits and decode. Running requests are served first (oldest first); when
pages run out the newest running request is preempted (its pages released, cached where full)
and later recomputed. Waiting requests are admitted FCFS while budget, slots and pages allow;
pages allow when, beside what every running request still needs for its known tokens and its
expected future output (``future_tokens``), they hold the new request's known and expected
tokens. So preemption stays rare however many requests may run.

Counters move when a step is planned, not when it returns: ``schedule`` advances
``num_computed_tokens`` and counts a pending token for each sampling chunk, and ``update``
appends the sampled tokens. So the next step can be planned while this one runs on the device
(overlap scheduling); its rows for pending tokens take their ids from the device.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from kvserve.config import SchedulerConfig
from kvserve.engine.core.future_tokens import FutureTokens
from kvserve.engine.core.kv_cache_manager import KVCacheManager
from kvserve.engine.core.request import FinishReason, Request, RequestStatus
from kvserve.engine.core.scheduler_output import ScheduledChunk, SchedulerOutput
from kvserve.kv_layout import pages_for

MIN_CAPPED_CHUNK = 256  # a capped chunk still amortizes the step's weight reads


@dataclass
class SchedulerCounters:
    """Monotonic totals for metrics."""

    prefix_cache_queries: int = 0  # prompt tokens looked up at first admission
    prefix_cache_hits: int = 0  # of those, tokens served from the cache
    preemptions: int = 0


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        """``config``'s running cap must be set (``SchedulerConfig.for_pool``)."""
        self.config = config
        self.max_running = config.running_ceiling
        self.future = FutureTokens.for_conservativeness(config.schedule_conservativeness)
        self.kv = kv
        self.page_size = kv.page_size
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.counters = SchedulerCounters()

    # -- queue management -------------------------------------------------------------------
    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def abort(self, request: Request) -> None:
        if not request.is_finished:
            self._finish(request, FinishReason.ABORT)

    def add_prefilled(self, request: Request) -> None:
        """A request whose prompt KV was computed elsewhere (a disaggregated prefill worker):
        its pages are in ``block_table``, its computed tokens cover the prompt and its first
        output token is known. It joins the running batch, or finishes at once if that token
        ends it."""
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        reason = self._stop_reason(request, request.output_token_ids[-1])
        if reason is not None:
            self._finish(request, reason)

    def has_room_for(self, request: Request) -> bool:
        """Whether a request whose prompt KV comes from elsewhere may join now: a running slot,
        and pages for its known and expected tokens beside what the running ones are owed."""
        if len(self.running) >= self.max_running:
            return False
        owed = self._pages_owed()
        return self.kv.num_available_pages - owed >= self._pages_expected(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def live_block_tables(self) -> list[list[int]]:
        return [r.block_table for r in self.running]

    # -- planning ---------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        # a request decodes this step: prefill chunks beside it are kept short (so are they
        # while other requests wait)
        decoding = any(r.num_tokens_with_pending - r.num_computed_tokens <= 1 for r in self.running)
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if req.ends_with_pending:
                i += 1
                continue
            n = min(
                req.num_tokens_with_pending - req.num_computed_tokens,
                self._chunk_limit(req.num_computed_tokens, decoding or bool(self.waiting)),
                budget,
            )
            if self._reserve(req, req.num_computed_tokens + n):
                out.chunks.append(self._chunk(req, n))
                budget -= n
                i += 1
                continue
            victim = self.running.pop()
            self._preempt(victim)
            out.preempted.append(victim)
        if out.preempted:
            self.future.after_preemption()
        else:
            if decoding:
                self.future.after_decode_step()
            budget = self._admit(out, budget, decoding)
        out.chunks.sort(key=lambda c: c.num_new_tokens > 1)  # decodes first (stable)
        out.num_batched_tokens = self.config.max_num_batched_tokens - budget
        for chunk in out.chunks:
            self._advance(chunk)
        return out

    def _chunk_limit(self, start: int, shared: bool) -> int:
        """Most tokens a chunk starting at ``start`` may take (``prefill_chunk_while_decoding``
        and ``chunk_attention_budget`` apply while other requests decode or wait)."""
        limit = self.config.chunked_prefill_size
        if not shared:
            return limit
        limit = min(limit, self.config.prefill_chunk_while_decoding)
        work = self.config.chunk_attention_budget
        if work:
            limit = min(limit, max(MIN_CAPPED_CHUNK, work // (start + limit)))
        return limit

    def _chunk(self, req: Request, n: int) -> ScheduledChunk:
        start = req.num_computed_tokens
        return ScheduledChunk(req, start, n, sample=start + n == req.num_tokens_with_pending)

    def _advance(self, chunk: ScheduledChunk) -> None:
        """Count the planned step as done. Runs after admission, so a request admitted in this
        step cannot match pages whose KV this same step computes."""
        req = chunk.request
        req.num_computed_tokens += chunk.num_new_tokens
        if chunk.sample:
            req.num_pending += 1
        self._cache_computed(req)

    def _reserve(self, req: Request, num_tokens: int) -> bool:
        needed = pages_for(num_tokens, self.page_size) - len(req.block_table)
        if needed <= 0:
            return True
        pages = self.kv.allocate(needed)
        if pages is None:
            return False
        req.block_table.extend(pages)
        return True

    def _admit(self, out: SchedulerOutput, budget: int, decoding: bool) -> int:
        owed = -1  # pages the running requests are owed (_pages_owed); -1: not yet counted
        while self.waiting and budget > 0 and len(self.running) < self.max_running:
            req = self.waiting[0]
            if req.num_pending or self._prefix_in_flight(req):
                # A preempted request waits for its in-flight token; a request sharing a
                # prefix being prefilled waits one step to hit the cache instead of recomputing.
                break
            # Leave at least one token to compute, so the step yields logits to sample from.
            cached_pages = self.kv.match_prefix(req.token_ids(0, req.num_tokens - 1))
            num_cached = len(cached_pages) * self.page_size
            shared = decoding or len(self.waiting) > 1
            n = min(req.num_tokens - num_cached, self._chunk_limit(num_cached, shared), budget)
            self.kv.acquire(cached_pages)
            new_pages = None
            owed = self._pages_owed() if owed < 0 else owed
            still_needed = self._pages_expected(req) - len(cached_pages)
            if self.kv.num_available_pages - owed >= still_needed:
                pages = pages_for(num_cached + n, self.page_size) - len(cached_pages)
                new_pages = self.kv.allocate(pages)
                owed += still_needed - pages
            if new_pages is None:
                self.kv.release(cached_pages)
                break
            self.waiting.popleft()
            if not req.admitted:
                req.admitted, req.num_cached_tokens = True, num_cached
                req.first_scheduled_time = time.monotonic()
                self.counters.prefix_cache_queries += req.num_prompt_tokens
                self.counters.prefix_cache_hits += num_cached
            req.block_table = cached_pages + new_pages
            req.num_computed_tokens = num_cached
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.chunks.append(self._chunk(req, n))
            budget -= n
        return budget

    def _pages_owed(self) -> int:
        """Pages the running requests still need for their known and expected tokens. A
        request starts its prefill only when the pages left beside these can hold all of its
        own: a prefill that could not finish would later preempt a request deep in its own
        prefill and compute it again (32 x 32K prompts in an H200's pool: about 100
        preemptions and a third more prefill work)."""
        return sum(max(0, self._pages_expected(r) - len(r.block_table)) for r in self.running)

    def _pages_expected(self, req: Request) -> int:
        """Pages ``req`` is expected to hold at its end: known tokens plus expected output."""
        return pages_for(req.num_tokens_with_pending + self.future.expected(req), self.page_size)

    def _prefix_in_flight(self, req: Request) -> bool:
        """True when a running request is still prefilling the same first page: admitting
        this one now would compute the shared prefix twice instead of hitting the cache."""
        if not self.kv.enable_prefix_cache or req.num_tokens <= self.page_size:
            return False
        head = req.token_ids(0, self.page_size)
        return any(
            r.num_computed_tokens < r.num_prompt_tokens
            and r.num_tokens > self.page_size
            and r.token_ids(0, self.page_size) == head
            for r in self.running
        )

    # -- results ----------------------------------------------------------------------------
    def update(self, plan: SchedulerOutput, sampled: dict[str, int]) -> list[Request]:
        """Append the executed plan's sampled tokens; finish requests that hit a stop
        condition. Returns the requests that got a token or finished."""
        changed = []
        for chunk in plan.chunks:
            req = chunk.request
            if not chunk.sample:
                continue
            req.num_pending -= 1
            if req.is_finished:
                continue  # aborted or stopped while the step ran: the token is dropped
            token = sampled[req.request_id]
            req.output_token_ids.append(token)
            reason = self._stop_reason(req, token)
            if reason is not None:
                self._finish(req, reason)
            changed.append(req)
        return changed

    def _stop_reason(self, req: Request, token: int) -> FinishReason | None:
        params = req.params
        if req.num_output_tokens >= params.min_tokens:
            if not params.ignore_eos and token in req.eos_token_ids:
                req.stop_reason = None  # vLLM: None means EOS
                return FinishReason.STOP
            if token in params.stop_token_ids:
                req.stop_reason = token
                return FinishReason.STOP
        if req.num_output_tokens >= req.max_tokens:
            return FinishReason.LENGTH
        return None

    def finish_by_stop_string(self, req: Request, stop: str) -> None:
        """Called by the output processor when detokenized text hits a stop string."""
        if not req.is_finished:
            req.stop_reason = stop
            self._finish(req, FinishReason.STOP)

    def _cache_computed(self, req: Request) -> None:
        """Insert the request's newly completed full pages of known tokens into the prefix
        cache (their KV is written by a step already launched, so any step that reads them
        runs after it)."""
        full = min(req.num_computed_tokens, req.num_tokens) // self.page_size
        if full <= req.num_cached_pages or not self.kv.enable_prefix_cache:
            return
        start = req.num_cached_pages
        tokens = req.token_ids(start * self.page_size, full * self.page_size)
        pages, node = self.kv.cache_pages(
            tokens, req.block_table[:full], start, req.last_cached_node
        )
        req.block_table[:full] = pages
        req.num_cached_pages, req.last_cached_node = full, node

    def _release(self, req: Request) -> None:
        self._cache_computed(req)
        self.kv.release(req.block_table)
        req.block_table = []
        req.num_cached_pages, req.last_cached_node = 0, None

    def _preempt(self, req: Request) -> None:
        self._release(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        self.counters.preemptions += 1
        self.waiting.appendleft(req)

    def _finish(self, req: Request, reason: FinishReason) -> None:
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
            self._release(req)
        elif req.status is RequestStatus.WAITING:
            self.waiting.remove(req)  # never scheduled, or preempted with a token in flight
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
