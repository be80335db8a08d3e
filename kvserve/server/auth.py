"""``--api-key``: every route but ``/health`` needs ``Authorization: Bearer <key>`` (pure ASGI
middleware, so streaming responses pass through untouched). ``/health`` stays open for load
balancers and supervisors; it tells nothing but whether the server can serve. A request with
more than one ``Authorization`` header is refused (which one a proxy checked is unknowable)."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from kvserve.server.errors import error_bytes

OPEN_PATHS = ("/health",)


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        values = [v for k, v in scope["headers"] if k.lower() == b"authorization"]
        if len(values) > 1:
            return await send_error(send, 400, "more than one Authorization header")
        got = values[0] if values else b""
        if hmac.compare_digest(got, self.expected):
            return await self.app(scope, receive, send)
        message = "missing API key" if not got else "invalid API key"
        await send_error(send, 401, message, [(b"www-authenticate", b"Bearer")])


async def send_error(
    send: Send, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = error_bytes(status, message)
    base = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": base + (headers or [])})
    await send({"type": "http.response.body", "body": body})
