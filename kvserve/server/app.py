"""The FastAPI app: OpenAI routes, vLLM's utility routes, health and metrics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request, Response

from kvserve import __version__
from kvserve.server import chat, completions
from kvserve.server.admission import Ticket, admit
from kvserve.server.auth import APIKeyMiddleware
from kvserve.server.body_limit import BodyLimitMiddleware
from kvserve.server.context import ServerContext
from kvserve.server.errors import APIError, error_response, install_handlers
from kvserve.server.limits import check_prompt_bytes, message_texts
from kvserve.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from kvserve.server.streaming import sse_response

T = TypeVar("T")


async def until_disconnected(request: Request, work: Awaitable[Any]) -> Any:
    """Run ``work``; if the client hangs up first, cancel it (which aborts its requests)."""
    task = asyncio.ensure_future(work)

    async def hung_up() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(hung_up())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        return Response(status_code=499)
    return task.result()


def create_app(
    ctx: ServerContext, api_key: str | None = None, max_request_bytes: int = 16 << 20
) -> FastAPI:
    app = FastAPI(title="kvserve", version=__version__, docs_url=None, redoc_url=None)
    install_handlers(app)
    app.state.ctx = ctx
    _utility_routes(app, ctx)
    _openai_routes(app, ctx)
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_request_bytes)
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    return app


async def _generate(
    ctx: ServerContext,
    request: Request,
    ticket: Ticket,
    stream: bool,
    prepare: Callable[[], T],
    full: Callable[[T], Awaitable[Any]],
    chunks: Callable[[T], AsyncIterator[dict[str, Any]]],
) -> Any:
    """Prepare off the event loop, then answer; the ticket is closed on every path."""
    try:
        prepared = await ctx.off_loop(prepare)
    except BaseException:
        ticket.close()
        raise
    if stream:
        return sse_response(chunks(prepared), on_close=ticket.close)
    try:
        return await until_disconnected(request, full(prepared))
    finally:
        ticket.close()


def _openai_routes(app: FastAPI, ctx: ServerContext) -> None:
    @app.post("/v1/completions")
    async def create_completion(body: CompletionRequest, request: Request) -> Any:
        ticket = admit(ctx, completions.check_fields(ctx, body))
        return await _generate(
            ctx, request, ticket, body.stream,
            lambda: completions.prepare(ctx, body, ticket),
            lambda p: completions.full_response(ctx, body, *p),
            lambda p: completions.stream_chunks(ctx, body, *p),
        )  # fmt: skip

    @app.post("/v1/chat/completions")
    async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Any:
        ticket = admit(ctx, chat.check_fields(ctx, body))
        return await _generate(
            ctx, request, ticket, body.stream,
            lambda: chat.ChatCall(ctx, body, ticket),
            lambda call: call.full_response(),
            lambda call: call.stream_chunks(),
        )  # fmt: skip

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        card = {"id": ctx.served_model_name, "object": "model", "created": ctx.created,
                "owned_by": "kvserve", "root": ctx.ready.model_path, "parent": None,
                "max_model_len": ctx.ready.context_length}  # fmt: skip
        return {"object": "list", "data": [card]}


def _utility_routes(app: FastAPI, ctx: ServerContext) -> None:
    @app.get("/health")
    async def health() -> Response:
        if ctx.client.dead is not None:
            return error_response(503, f"the engine is not running: {ctx.client.dead}")
        silent = ctx.client.seconds_since_heard()
        if silent > ctx.engine_stall_timeout_s:
            return error_response(503, f"the engine has sent nothing for {silent:.0f} s "
                                  "(--engine-stall-timeout): it looks stuck")  # fmt: skip
        if ctx.draining:
            return error_response(503, "the server is shutting down")
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @app.get("/metrics")
    async def metrics() -> Response:
        c = ctx.client
        ctx.metrics.on_admission(c.num_admitted, c.num_reserved, c.num_sent - c.num_engine_handled)
        return Response(ctx.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        ctx.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give exactly one of prompt and messages", "prompt")
        if body.messages is not None:
            req = ChatCompletionRequest(
                messages=body.messages, add_generation_prompt=body.add_generation_prompt
            )
            check_prompt_bytes(message_texts(body.messages), ctx.limits, "messages")
            ids = await ctx.off_loop(lambda: ctx.tokenizer.encode(
                chat.render_prompt(ctx, req), add_special_tokens=False))  # fmt: skip
        else:
            text = body.prompt or ""
            check_prompt_bytes([text], ctx.limits, "prompt")
            ids = await ctx.off_loop(ctx.tokenizer.encode, text, body.add_special_tokens)
        return {"count": len(ids), "max_model_len": ctx.ready.context_length, "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        ctx.check_model(body.model)
        vocab = ctx.ready.vocab_size
        bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is outside the vocabulary (0..{vocab - 1})",
                           "tokens")  # fmt: skip
        return {"prompt": await ctx.off_loop(ctx.tokenizer.decode, body.tokens)}
