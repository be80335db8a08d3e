"""``POST /v1/completions``: prompts as text, lists of text, token ids or lists of them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from kvserve.server.admission import Ticket
from kvserve.server.context import ServerContext
from kvserve.server.errors import APIError
from kvserve.server.generation import Generation
from kvserve.server.limits import check_completion, prompt_list
from kvserve.server.logprobs import completion_logprobs
from kvserve.server.protocol import CompletionRequest
from kvserve.server.sampling import build_params
from kvserve.server.validation import refuse_text_that_cannot_fit


def _prompts(ctx: ServerContext, req: CompletionRequest) -> tuple[list[list[int]], list[str]]:
    """Token ids and text of every prompt in the request."""
    p = prompt_list(req)
    if not p:
        raise APIError(400, "the prompt is empty", "prompt")
    tok = ctx.tokenizer
    ids, texts = [], []
    for item in p:
        if isinstance(item, str):
            if not item:
                raise APIError(400, "the prompt is empty", "prompt")
            refuse_text_that_cannot_fit(tok, item, ctx.ready, "prompt")
            ids.append(tok.encode(item, add_special_tokens=True))
            texts.append(item)
        else:
            ids.append(list(item))
            texts.append("")  # decoded only when echo asks for it
    return ids, texts


def check_fields(ctx: ServerContext, req: CompletionRequest) -> int:
    """The checks that need no tokenizer; returns how many engine requests it makes."""
    ctx.check_model(req.model)
    if req.suffix:
        raise APIError(400, "suffix is not supported", "suffix")
    if req.echo and req.logprobs is not None:
        raise APIError(400, "echo with logprobs (prompt logprobs) is not supported", "echo")
    return check_completion(req, ctx.limits, ctx.ready)


def prepare(
    ctx: ServerContext, req: CompletionRequest, ticket: Ticket
) -> tuple[Generation, list[str]]:
    """Tokenize and check (CPU-heavy: runs off the event loop)."""
    ids, texts = _prompts(ctx, req)
    params = build_params(req, ctx.ready, req.max_tokens, req.logprobs)
    gen = Generation(ctx, ids, params, "cmpl", ticket, req.kv_transfer_params, req.stream)
    if req.echo:
        texts = [t or ctx.tokenizer.decode(i) for t, i in zip(texts, ids)]
    return gen, texts


def _choice(index: int, text: str, **fields: Any) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": None, "finish_reason": None, **fields}


async def full_response(
    ctx: ServerContext, req: CompletionRequest, gen: Generation, echo: list[str]
) -> dict[str, Any]:
    await gen.collect()
    choices = []
    for c in gen.choices:
        st = c.state
        assert st is not None
        prefix = echo[c.prompt_index] if req.echo else ""
        lps = (
            completion_logprobs(ctx.tokenizer, st.logprobs, len(prefix))
            if req.logprobs is not None
            else None
        )
        choices.append({"index": c.index, "text": prefix + st.text, "logprobs": lps,
                        "finish_reason": st.finish_reason,
                        "stop_reason": st.stop_reason})  # fmt: skip
    return {
        "id": gen.id,
        "object": "text_completion",
        "created": gen.created,
        "model": ctx.served_model_name,
        "choices": choices,
        "usage": gen.usage(),
        **gen.answer_fields(),
    }


async def stream_chunks(
    ctx: ServerContext, req: CompletionRequest, gen: Generation, echo: list[str]
) -> AsyncIterator[dict[str, Any]]:
    head = {"id": gen.id, "object": "text_completion", "created": gen.created,
            "model": ctx.served_model_name}  # fmt: skip
    offsets = {c.index: 0 for c in gen.choices}
    if req.echo:
        for c in gen.choices:
            text = echo[c.prompt_index]
            yield {**head, "choices": [_choice(c.index, text)]}
    async for d in gen.deltas():
        if not d.text and d.finish_reason is None and not d.logprobs:
            continue
        lps = None
        if req.logprobs is not None:
            lps = completion_logprobs(ctx.tokenizer, d.logprobs, offsets[d.choice.index])
        offsets[d.choice.index] += len(d.text)
        choice = _choice(d.choice.index, d.text, logprobs=lps, finish_reason=d.finish_reason)
        if d.finish_reason is not None:
            choice["stop_reason"] = d.choice.state.stop_reason if d.choice.state else None
        yield {**head, "choices": [choice]}
    if req.stream_options is not None and req.stream_options.include_usage:
        yield {**head, "choices": [], "usage": gen.usage()}
