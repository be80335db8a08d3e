"""OpenAI-shaped errors from the router, as HTTP responses or as an in-band SSE event once a
stream has started (its status line is already sent)."""

from __future__ import annotations

import json

from aiohttp import web

from kvserve.openai_errors import error_body


def error_response(status: int, message: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> web.Response:  # fmt: skip
    body = json.dumps(error_body(status, message, param)).encode()
    return web.Response(status=status, body=body, content_type="application/json",
                        headers=headers)  # fmt: skip


def sse_error(status: int, message: str) -> bytes:
    return b"data: " + json.dumps(error_body(status, message)).encode() + b"\n\ndata: [DONE]\n\n"
