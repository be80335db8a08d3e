"""An OpenAI-compatible server (kvserve, vLLM, SGLang, llama.cpp) over HTTP.

Non-streaming requests, ``temperature: 0``, a fixed ``max_tokens``; chat tasks go to
``/v1/chat/completions`` (the server applies its chat template), prompt tasks to
``/v1/completions``. Up to ``concurrency`` requests are in flight at once."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx

from kvserve.bench.client import PATHS, probe
from kvserve.evaluate.completion import Completion
from kvserve.evaluate.targets import Sink
from kvserve.evaluate.tasks import Task


@dataclass
class HttpTarget:
    name: str
    base_url: str
    model: str | None = None  # None: the first model the server lists
    api_key: str | None = None
    timeout_s: float = 600.0

    @property
    def identity(self) -> str:
        return f"http {self.base_url} model={self.model or '(first listed)'}"

    def run(self, tasks: list[Task], max_tokens: int, concurrency: int, sink: Sink) -> None:
        asyncio.run(self._run(tasks, max_tokens, concurrency, sink))

    async def _run(self, tasks: list[Task], max_tokens: int, concurrency: int, sink: Sink) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(
            headers=headers, timeout=self.timeout_s, limits=limits
        ) as http:
            listed = await probe(http, self.base_url)
            model = self.model or (listed[0] if listed else None)
            gate = asyncio.Semaphore(concurrency)

            async def one(task: Task) -> None:
                async with gate:
                    sink(task, await _ask(http, self.base_url, model, task, max_tokens))

            await asyncio.gather(*(one(t) for t in tasks))


async def _ask(http: httpx.AsyncClient, base_url: str, model: str | None, task: Task,
               max_tokens: int) -> Completion:  # fmt: skip
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0.0, **task.request()}
    if model is not None:
        body["model"] = model
    try:
        resp = await http.post(base_url + PATHS[task.endpoint], json=body)
    except httpx.HTTPError as exc:
        return Completion("", error=f"{type(exc).__name__}: {exc}")
    try:
        data = resp.json()
    except ValueError:
        data = None
    if resp.status_code != 200 or not isinstance(data, dict):
        return Completion("", error=_error_text(resp.status_code, data, resp.text))
    try:
        choice = data["choices"][0]
        text = choice["message"]["content"] if task.endpoint == "chat" else choice["text"]
    except (KeyError, IndexError, TypeError):
        return Completion("", error=f"not an OpenAI response: {resp.text[:200]!r}")
    usage = data.get("usage") or {}
    return Completion(text or "", int(usage.get("completion_tokens") or 0),
                      choice.get("finish_reason"))  # fmt: skip


def _error_text(status: int, data: Any, raw: str) -> str:
    err = data.get("error") if isinstance(data, dict) else None
    message = err.get("message") if isinstance(err, dict) else err
    return f"HTTP {status}: {message or raw[:200].strip()}"
