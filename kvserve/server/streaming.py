"""Server-sent events: one ``data:`` line per chunk, ``data: [DONE]`` at the end, and an
OpenAI-shaped error event when a stream fails after it started (the status is already sent)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from kvserve.server.errors import APIError, error_body

log = logging.getLogger("kvserve.server")
DONE = b"data: [DONE]\n\n"


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


async def _guarded(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            yield sse(chunk)
    except APIError as exc:
        yield sse(error_body(exc.status, exc.message, exc.param))
    except Exception as exc:  # the status line is sent: report in-band, never a traceback
        log.exception("stream failed")
        yield sse(error_body(500, f"internal error: {type(exc).__name__}"))
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]  # aborts what is left at once
    yield DONE


class _ClosingStreamingResponse(StreamingResponse):
    """Runs ``on_close`` however the response ends, even when the client went away before the
    body started (then the chunk generator never runs, so its own ``finally`` cannot)."""

    def __init__(self, chunks: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(chunks, media_type="text/event-stream", headers=headers)
        self._chunks, self._on_close = chunks, on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self._chunks.aclose()  # type: ignore[attr-defined]
            finally:
                self._on_close()


def sse_response(
    chunks: AsyncIterator[dict[str, Any]], on_close: Callable[[], None] = lambda: None
) -> StreamingResponse:
    return _ClosingStreamingResponse(_guarded(chunks), on_close)
