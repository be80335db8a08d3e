"""One phase of a run (warmup or measured): the request budget, the ideal-hit tracker and the
records; sends units, a chat session turn after turn with the server's real answers."""

from __future__ import annotations

import asyncio
import itertools
import time

import httpx

from kvserve.bench.client import Target, build_body, chat_messages, send
from kvserve.bench.ideal import PrefixTracker
from kvserve.bench.profiles import Unit
from kvserve.bench.progress import Progress
from kvserve.bench.records import RequestRecord
from kvserve.bench.tokens import Tokenizer


def prompt_ids(tok: Tokenizer, endpoint: str, unit: Unit, history: list[dict], user: str
               ) -> list[int]:  # fmt: skip
    """Client token ids of what is sent (the ideal-hit-rate input)."""
    if endpoint == "chat":
        return tok.encode(tok.render_chat(chat_messages(unit.system, history, user)))
    if unit.ids is not None and not history:
        return unit.ids
    return tok.encode(f"{unit.system}\n\n{user}" if unit.system else user)


class Phase:
    """State shared by the tasks of one phase (warmup or measured)."""

    def __init__(self, http: httpx.AsyncClient, target: Target, tok: Tokenizer,
                 tracker: PrefixTracker, progress: Progress, t0: float) -> None:  # fmt: skip
        self.http, self.target, self.tok, self.tracker = http, target, tok, tracker
        self.progress, self.t0 = progress, t0
        self.records: list[RequestRecord] = []
        self.remaining: int | None = None
        self.deadline: float | None = None
        self.warmup = False
        self._sessions = itertools.count()

    def more(self) -> bool:
        if self.remaining is not None and self.remaining <= 0:
            return False
        return self.deadline is None or time.perf_counter() - self.t0 < self.deadline

    def take(self) -> bool:
        if not self.more():
            return False
        if self.remaining is not None:
            self.remaining -= 1
        return True

    async def unit(self, unit: Unit, delay_s: float) -> None:
        endpoint = "chat" if unit.session else self.target.endpoint
        session = next(self._sessions) if unit.session else None
        history: list[dict] = []
        for k, turn in enumerate(unit.turns):
            if k and delay_s:
                await asyncio.sleep(delay_s)
            if not self.take():
                return
            rec = RequestRecord(len(self.records), unit.cls, session, k, self.warmup,
                                expected_output_tokens=turn.max_tokens)  # fmt: skip
            self.records.append(rec)
            if unit.ids is not None and endpoint == "completions" and not unit.system:
                ids = unit.ids
            else:  # tokenizing a long prompt must not stall the timing of other streams
                ids = await asyncio.to_thread(
                    prompt_ids, self.tok, endpoint, unit, history, turn.user
                )
            rec.ideal_cached_tokens = self.tracker.observe(ids)
            path, body = build_body(self.target, endpoint, unit.system, history, turn.user,
                                    turn.max_tokens)  # fmt: skip
            text = await send(self.http, self.target, path, body, rec, self.t0)
            self._account(rec, ids, text)
            if not rec.ok:
                return
            history += [{"role": "user", "content": turn.user},
                        {"role": "assistant", "content": text}]  # fmt: skip

    def _account(self, rec: RequestRecord, ids: list[int], text: str) -> None:
        """Client-side counts where the server gave no usage."""
        if rec.ok and rec.prompt_tokens is None:
            rec.token_source = "tokenizer" if self.tok.exact else "estimate"
            rec.prompt_tokens = len(ids)
        if rec.ok and rec.completion_tokens is None:
            rec.token_source = "tokenizer" if self.tok.exact else "estimate"
            rec.completion_tokens = (
                len(self.tok.encode(text)) if self.tok.exact else len(rec.chunk_times)
            )
        self.progress.done += 1
        self.progress.failed += 0 if rec.ok else 1
        self.progress.chunks += len(rec.chunk_times)
