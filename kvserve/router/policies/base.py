"""The policy seam. A `Policy` picks one worker from the routable candidates; a `PairPolicy`
picks a (prefill, decode) pair for disaggregated serving. Both see only routable workers
(healthy, not draining, breaker not open), so a policy never has to know about failures.

`RouteRequest.key` is the request's prefix for cache-aware routing: the prompt's characters,
or its token ids when the client sent ids. It is built only when the policy asks for it."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvserve.router.worker import Worker

PrefixKey = str | tuple[int, ...]


@dataclass
class RouteRequest:
    key: PrefixKey | None = None
    body: dict[str, Any] | None = None  # the generation request as parsed (PD rewrites it)


class Policy(Protocol):
    name: str
    needs_key: bool

    def select(self, workers: Sequence[Worker], request: RouteRequest) -> Worker: ...


class PairPolicy(Protocol):
    name: str
    needs_key: bool

    def select_pair(self, prefill: Sequence[Worker], decode: Sequence[Worker],
                    request: RouteRequest) -> tuple[Worker, Worker]: ...  # fmt: skip


def _token_key(ids: list[Any]) -> tuple[int, ...]:
    """The ids as a tuple, non-ints left out. The all-int check runs in C (array): a 500K-id
    prompt took 44 ms in a Python loop, on the router's event loop."""
    try:
        array("q", ids)
        return tuple(ids)
    except (TypeError, OverflowError):
        return tuple(p for p in ids if isinstance(p, int))


def prefix_key(body: dict[str, Any]) -> PrefixKey | None:
    """The text (or token ids) a worker's prefix cache would match: the completion prompt, or
    the chat messages rendered as `role: content` lines. None when there is nothing usable."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, int):
            return _token_key(prompt)
        prompt = first
        if isinstance(prompt, list):
            return _token_key(prompt)
    if isinstance(prompt, str):
        return prompt or None
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = []
        for m in messages:
            if isinstance(m, dict):
                content = m.get("content")
                text = content if isinstance(content, str) else str(content)
                parts.append(f"{m.get('role')}: {text}\n")
        return "".join(parts) or None
    return None
