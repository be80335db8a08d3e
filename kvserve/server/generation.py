"""One HTTP request's engine requests: ``n`` children per prompt, their outputs turned into
text deltas by an ``OutputProcessor``, stop strings sent back to the engine, latency metrics
observed, and every unfinished child aborted if the caller goes away. Children are sent
through the request's admission ``Ticket``."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

from kvserve.engine.core.outputs import TokenLogprobs
from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.engine.ipc.core_client import EngineDeadError
from kvserve.engine.ipc.messages import RequestFailed
from kvserve.engine.output_processor import OutputProcessor, StreamState
from kvserve.server.admission import Ticket
from kvserve.server.context import ServerContext
from kvserve.server.errors import APIError
from kvserve.server.pd_request import answer_fields, engine_params, remote_prefill
from kvserve.server.validation import check_prompt


@dataclass
class Choice:
    index: int  # prompt_index * n + i, as OpenAI numbers choices
    prompt_index: int
    request_id: str
    state: StreamState | None = None
    started: float = 0.0
    last_token_at: float | None = None


@dataclass
class Delta:
    choice: Choice
    text: str
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None


class Generation:
    def __init__(
        self,
        ctx: ServerContext,
        prompts: list[list[int]],
        params: SamplingParams,
        kind: str,
        ticket: Ticket,
        kv_transfer_params: dict | None = None,
        stream: bool = False,
    ) -> None:
        self.prompt_params = [_with_default_max_tokens(ctx, ids, params) for ids in prompts]
        for ids, p in zip(prompts, self.prompt_params):
            check_prompt(ids, p, ctx.ready)
        choices = len(prompts) * params.n
        self.remote = remote_prefill(ctx.disagg, kv_transfer_params, choices, stream)
        self.prompt_params = [engine_params(ctx.disagg, p) for p in self.prompt_params]
        self.ctx, self.prompts, self.params, self.ticket = ctx, prompts, params, ticket
        self.id = f"{kind}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.choices = [
            Choice(p * params.n + i, p, f"{self.id}-{p}-{i}")
            for p in range(len(prompts))
            for i in range(params.n)
        ]
        self.processor = OutputProcessor(ctx.tokenizer)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.num_finished = 0

    def _child_params(self, prompt_index: int, i: int) -> SamplingParams:
        p = self.prompt_params[prompt_index]
        if p.seed is None or i == 0:
            return p
        return replace(p, seed=(p.seed + i + 2**63) % 2**64 - 2**63)  # stays an int64

    def _start(self) -> None:
        if self.ctx.client.dead is not None:
            raise APIError(503, f"the engine stopped: {self.ctx.client.dead}")
        now = time.monotonic()
        for c in self.choices:
            params = self._child_params(c.prompt_index, c.index % self.params.n)
            ids = self.prompts[c.prompt_index]
            self.processor.add(c.request_id, ids, params)
            c.state, c.started = self.processor.states[c.request_id], now
            self.ticket.send(c.request_id, ids, params, self.queue, self.remote)

    async def deltas(self) -> AsyncIterator[Delta]:
        """Start the children and yield their text as it comes; abort what is left if the
        consumer stops early (client disconnect, error). Nothing reaches the engine until the
        first item is asked for, so a stream that never starts leaves nothing behind."""
        self._start()
        by_id = {c.request_id: c for c in self.choices}
        try:
            while self.num_finished < len(self.choices):
                item = await self.queue.get()
                if isinstance(item, EngineDeadError):
                    raise APIError(503, f"the engine stopped: {item}")
                if isinstance(item, RequestFailed):
                    raise APIError(item.status, item.message, item.param)
                delta = self._apply(by_id[item.request_id], item)
                if delta is not None:
                    yield delta
        finally:
            unfinished = [c for c in self.choices if c.state is None or not c.state.finished]
            if unfinished:
                self.ctx.client.abort([c.request_id for c in unfinished])
                for _ in unfinished:
                    self.ctx.metrics.request_finished("abort", 0)

    def _apply(self, choice: Choice, out) -> Delta | None:  # out: EngineCoreOutput
        st = choice.state
        if st is None or st.finished:
            return None  # outputs still in flight after a stop string ended it here
        before = len(st.logprobs)
        st, hit = self.processor.process(out)
        if hit is not None:
            self.ctx.client.stop(choice.request_id, hit)
        self._observe(choice, st)
        text = self.processor.take_delta(st)
        delta = Delta(choice, text, st.logprobs[before:], st.finish_reason)
        if st.finished:
            self.num_finished += 1
        return delta

    def _observe(self, choice: Choice, st: StreamState) -> None:
        m, now = self.ctx.metrics, time.monotonic()
        if choice.last_token_at is None:
            m.ttft.observe(now - choice.started)
        else:
            m.itl.observe(now - choice.last_token_at)
        choice.last_token_at = now
        if st.finished:
            m.e2e.observe(now - choice.started)
            m.request_finished(st.finish_reason or "stop", st.num_prompt_tokens)

    async def collect(self) -> None:
        async for _ in self.deltas():
            pass

    def answer_fields(self) -> dict:
        """Fields a prefill worker adds to its answer (``kv_transfer_params``)."""
        return answer_fields(self.ctx.disagg, [c.request_id for c in self.choices])

    # -- usage ------------------------------------------------------------------------------
    def usage(self) -> dict:
        firsts = [c.state for c in self.choices if c.index % self.params.n == 0]
        prompt = sum(len(ids) for ids in self.prompts)
        cached = sum(st.num_cached_tokens for st in firsts if st is not None)
        completion = sum(len(c.state.token_ids) for c in self.choices if c.state is not None)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }


def _with_default_max_tokens(
    ctx: ServerContext, ids: list[int], params: SamplingParams
) -> SamplingParams:
    """max_tokens left out: ``--default-max-tokens``, cut to what the context leaves."""
    if params.max_tokens is not None:
        return params
    room = ctx.ready.context_length - len(ids)
    if room < 1:
        return params  # check_prompt says the prompt leaves no room
    return replace(params, max_tokens=min(ctx.limits.default_max_tokens, room))
