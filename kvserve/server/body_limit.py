"""``--max-request-bytes``: bodies over the limit get 413 before the app parses them, whether
announced by Content-Length or discovered while a chunked body arrives."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvserve.server.auth import send_error


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await send_error(send, 413, self._message())
        # Read the body up front (bounded), then replay it to the app.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before sending its body
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                return await send_error(send, 413, self._message())
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _message(self) -> str:
        return f"the request body is larger than the limit of {self.max_bytes} bytes"
