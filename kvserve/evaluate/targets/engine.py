"""A kvserve engine started in this process from a model path and engine settings
(``kvserve.LLM(model=..., **settings)``), built when its turn comes and dropped afterwards so
that two models never sit in memory at once."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field, replace
from typing import Any

from kvserve.errors import KVServeError
from kvserve.evaluate.completion import Completion
from kvserve.evaluate.targets import Sink
from kvserve.evaluate.tasks import Task


@dataclass
class EngineTarget:
    name: str
    model: str | None = None  # None: the bundled model
    settings: dict[str, Any] = field(default_factory=dict)
    llm: Any = None  # an LLM already built (tests reuse the session's); else built in run()
    load_seconds: float = 0.0  # building the engine in run(), kept apart from answering

    @property
    def identity(self) -> str:
        shown = ",".join(f"{k}={v}" for k, v in sorted(self.settings.items()))
        return f"engine model={self.model or 'bundled'} {shown}".strip()

    def run(self, tasks: list[Task], max_tokens: int, concurrency: int, sink: Sink) -> None:
        from kvserve.engine.llm import LLM

        start = time.perf_counter()
        llm = self.llm or LLM(model=self.model, **self.settings)
        self.load_seconds = round(time.perf_counter() - start, 3)
        params = replace(llm.default_sampling_params(), temperature=0.0, max_tokens=max_tokens)
        try:
            # Batches of `concurrency` tasks: the engine batches within one call; between calls
            # outputs reach the cache, so an interrupted run keeps what finished.
            for start in range(0, len(tasks), concurrency):
                _run_batch(llm, tasks[start : start + concurrency], params, sink)
        finally:
            if self.llm is None:
                del llm
                gc.collect()


def _run_batch(llm: Any, batch: list[Task], params: Any, sink: Sink) -> None:
    chats = [t for t in batch if t.messages is not None]
    prompts = [t for t in batch if t.messages is None]
    try:
        outs = (llm.chat([t.messages for t in chats], params) if chats else []) + (
            llm.generate([t.prompt for t in prompts], params) if prompts else []
        )
    except KVServeError as exc:
        if len(batch) == 1:  # this task is the bad one (e.g. longer than the context)
            sink(batch[0], Completion("", error=str(exc)))
            return
        for task in batch:  # find it: prompts are checked before anything is queued
            _run_batch(llm, [task], params, sink)
        return
    for task, out in zip(chats + prompts, outs, strict=True):
        sink(task, Completion(out.text, len(out.token_ids), out.finish_reason))
