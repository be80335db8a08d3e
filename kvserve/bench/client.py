"""The streaming client: one OpenAI-compatible request -> one RequestRecord.

Times are taken with ``time.perf_counter`` (monotonic) the moment each network read returns,
before any parsing, so the client's own work never lands inside a measured interval.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx

from kvserve.bench.records import RequestRecord
from kvserve.bench.sse import SSEBuffer, parse_event
from kvserve.errors import ConfigError

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(frozen=True)
class Target:
    base_url: str
    model: str = "default"
    endpoint: str = "completions"  # chat | completions (sessions always use chat)
    api_key: str | None = None
    ignore_eos: bool = True
    timeout_s: float = 3600.0

    def headers(self) -> dict[str, str]:
        headers = {"Accept-Encoding": "identity", "Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers


def build_body(
    target: Target, endpoint: str, system: str | None, history: list[dict], user: str,
    max_tokens: int,
) -> tuple[str, dict]:  # fmt: skip
    body: dict = {
        "model": target.model,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }
    if target.ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = max_tokens
    if endpoint == "chat":
        body["messages"] = chat_messages(system, history, user)
    else:
        body["prompt"] = f"{system}\n\n{user}" if system else user
    return PATHS[endpoint], body


def chat_messages(system: str | None, history: list[dict], user: str) -> list[dict]:
    head = [{"role": "system", "content": system}] if system else []
    return head + history + [{"role": "user", "content": user}]


def _http_error(status: int, body: bytes) -> str:
    try:
        err = json.loads(body).get("error")
        message = err.get("message") if isinstance(err, dict) else err
    except (ValueError, AttributeError):
        message = None
    return f"HTTP {status}: {message or body[:200].decode('utf-8', 'replace').strip()}"


def _apply_usage(rec: RequestRecord, usage: dict) -> None:
    rec.prompt_tokens = usage.get("prompt_tokens", rec.prompt_tokens)
    rec.completion_tokens = usage.get("completion_tokens", rec.completion_tokens)
    details = usage.get("prompt_tokens_details") or {}
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        rec.cached_tokens = int(details["cached_tokens"])
    rec.token_source = "usage"


async def _read_stream(resp: httpx.Response, rec: RequestRecord, t0: float) -> str:
    """Reads the SSE stream into ``rec``; returns the generated text."""
    buf = SSEBuffer()
    parts: list[str] = []
    payloads = 0
    async for data in resp.aiter_raw():
        now = time.perf_counter() - t0
        for payload in buf.feed(data):
            payloads += 1
            event = parse_event(payload)
            rec.end = now
            if event.error:
                raise RuntimeError(event.error)
            if event.text:
                if rec.ttft is None:
                    rec.ttft = now - rec.start
                rec.chunk_times.append(now)
                parts.append(event.text)
            if event.usage:
                _apply_usage(rec, event.usage)
    if payloads == 0 and buf.leftover.strip():
        raise ValueError(f"not an SSE stream: {buf.leftover[:120]!r}")
    return "".join(parts)


async def send(
    http: httpx.AsyncClient, target: Target, path: str, body: dict, rec: RequestRecord, t0: float
) -> str:
    """Sends one request; failures land in ``rec.error``/``rec.error_kind``, never raise."""
    rec.start = time.perf_counter() - t0
    try:
        async with http.stream("POST", target.base_url + path, json=body) as resp:
            rec.status = resp.status_code
            if resp.status_code != 200:
                rec.end = time.perf_counter() - t0
                message = _http_error(resp.status_code, await resp.aread())
                return _fail(rec, f"http_{resp.status_code}", message)
            text = await _read_stream(resp, rec, t0)
    except httpx.ConnectError as exc:
        return _fail(rec, "connect", f"cannot connect: {exc}")
    except httpx.TimeoutException as exc:
        return _fail(rec, "timeout", f"timed out: {type(exc).__name__}")
    except (httpx.TransportError, httpx.StreamError) as exc:
        return _fail(rec, "stream", f"stream broken: {type(exc).__name__}: {exc}")
    except ValueError as exc:
        return _fail(rec, "bad_response", f"not an OpenAI stream: {exc}")
    except RuntimeError as exc:
        return _fail(rec, "server_error", f"error event: {exc}")
    if not rec.chunk_times:
        why = "the stream carried no generated text"
        if rec.completion_tokens:
            why += (f" (usage counts {rec.completion_tokens} completion tokens: ids the "
                    "tokenizer decodes to nothing?)")  # fmt: skip
        return _fail(rec, "no_output", why)
    return text


def _fail(rec: RequestRecord, kind: str, message: str) -> str:
    rec.error_kind, rec.error = kind, message
    rec.end = max(rec.end, rec.start)
    return ""


async def probe(http: httpx.AsyncClient, base_url: str) -> list[str]:
    """Checks the target answers before a run; returns the model ids it lists (maybe none)."""
    try:
        resp = await http.get(base_url + "/v1/models", timeout=10.0)
    except httpx.HTTPError as exc:
        raise ConfigError(f"cannot reach {base_url}: {type(exc).__name__}: {exc}") from None
    if resp.status_code in (401, 403):
        raise ConfigError(f"{base_url} refused the request (HTTP {resp.status_code}): --api-key?")
    try:
        return [m["id"] for m in resp.json().get("data", []) if isinstance(m, dict) and "id" in m]
    except (ValueError, AttributeError, TypeError):
        return []
