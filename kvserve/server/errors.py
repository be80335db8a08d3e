"""Every error leaves the server OpenAI-shaped: ``{"error": {message, type, param, code}}``."""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from kvserve.errors import InvalidRequestError
from kvserve.openai_errors import error_body
from kvserve.server import unsupported

log = logging.getLogger("kvserve.server")


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    @classmethod
    def from_invalid(cls, exc: InvalidRequestError) -> APIError:
        return cls(400, str(exc), exc.param)


def error_response(
    status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None
) -> Response:
    # ensure_ascii: an error message that quotes odd input can still be encoded
    body = json.dumps(error_body(status, message, param)).encode()
    return Response(body, status, headers, media_type="application/json")


def error_bytes(status: int, message: str) -> bytes:
    return json.dumps(error_body(status, message)).encode()


_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _path(loc: tuple) -> list[str]:
    """A pydantic location without ``body`` and union-branch names (``list[str]``, ...)."""
    return [str(p) for p in loc if p != "body" and str(p) not in _UNION_TAGS
            and not any(c in str(p) for c in "[(")]  # fmt: skip


def _describe(e: dict) -> tuple[str, str | None]:
    path = _path(e.get("loc", ()))
    where = ".".join(path) or None
    kind = e.get("type")
    if kind == "extra_forbidden" and path:
        return f"{where}: {unsupported.reason(path[-1])}", where
    top = path[0] if path else ""
    if kind == "literal_error" and top in ("response_format", "parallel_tool_calls"):
        return f"{where}: {unsupported.reason(top)}", top
    if kind == "literal_error" and path[-1:] == ["type"] and "content" in path:
        return f"{where}: {unsupported.reason('content')}", where
    msg = str(e.get("msg", "invalid value")).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg, where


def _rank(e: dict) -> int:
    """Errors that say most come first: an unsupported field before a union's other branches."""
    if e.get("type") in ("extra_forbidden", "value_error", "literal_error"):
        return 0
    return 1


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = sorted(exc.errors(), key=_rank)
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"the body is not valid JSON: {first.get('ctx', {}).get('error', '')}", None
    described = [_describe(e) for e in errors[:3]]
    return "invalid request: " + "; ".join(m for m, _ in described), described[0][1]


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api(_: Request, exc: APIError) -> Response:
        return error_response(exc.status, exc.message, exc.param)

    @app.exception_handler(InvalidRequestError)
    async def _invalid(_: Request, exc: InvalidRequestError) -> Response:
        return error_response(400, str(exc), exc.param)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> Response:
        message, param = _validation_message(exc)
        return error_response(400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            return error_response(404, f"no route {request.url.path}")
        if exc.status_code == 405:
            resp = error_response(405, f"method {request.method} not allowed here")
            resp.headers.update(exc.headers or {})  # Allow: the methods the route takes
            return resp
        return error_response(exc.status_code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> Response:
        log.exception("internal error")
        return error_response(500, f"internal error: {type(exc).__name__}")
