"""``POST /v1/chat/completions``: messages through the model's chat template; reasoning and
tool calls split out of the answer by the configured parsers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from kvserve.server.admission import Ticket
from kvserve.server.chat_output import ChatOutputSplitter
from kvserve.server.context import ServerContext
from kvserve.server.errors import APIError
from kvserve.server.generation import Generation
from kvserve.server.limits import check_chat
from kvserve.server.logprobs import chat_logprobs
from kvserve.server.protocol import ChatCompletionRequest, ChatMessage
from kvserve.server.sampling import build_params
from kvserve.server.validation import refuse_text_that_cannot_fit


def message_dict(m: ChatMessage) -> dict[str, Any]:
    content = m.content
    if isinstance(content, list):
        content = "".join(part.text or "" for part in content if part.type == "text")
    out = m.model_dump(exclude_none=True)
    out["content"] = content or ""
    return out


# chat_template_kwargs may not override what the call itself passes or asks for
_RESERVED_TEMPLATE_KWARGS = {"messages", "tools", "add_generation_prompt", "special_tokens",
                             "documents", "tokenize", "return_dict", "chat_template",
                             "continue_final_message"}  # fmt: skip


def check_fields(ctx: ServerContext, req: ChatCompletionRequest) -> int:
    """The checks that need no tokenizer; returns how many engine requests it makes."""
    ctx.check_model(req.model)
    if req.tool_choice not in (None, "none", "auto"):
        raise APIError(400, "only tool_choice 'auto' and 'none' are supported (forcing a "
                       "call needs guided decoding)", "tool_choice")  # fmt: skip
    if req.top_logprobs and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    clash = _RESERVED_TEMPLATE_KWARGS & set(req.chat_template_kwargs or {})
    if clash:
        raise APIError(400, f"chat_template_kwargs may not set {sorted(clash)}",
                       "chat_template_kwargs")  # fmt: skip
    return check_chat(req, ctx.limits, ctx.ready)


def render_prompt(ctx: ServerContext, req: ChatCompletionRequest) -> str:
    tools = None
    if req.tools and req.tool_choice != "none":
        tools = [t.model_dump(exclude_none=True) for t in req.tools]
    try:
        return ctx.tokenizer.apply_chat_template(
            [message_dict(m) for m in req.messages],
            add_generation_prompt=req.add_generation_prompt,
            tools=tools,
            **(req.chat_template_kwargs or {}),
        )
    except Exception as exc:  # a template may raise on messages it does not accept
        raise APIError(400, f"the chat template rejected the messages: {exc}", "messages") from exc


class ChatCall:
    """A prepared chat request: its generation and how to split each choice's text."""

    def __init__(self, ctx: ServerContext, req: ChatCompletionRequest, ticket: Ticket) -> None:
        """Template and tokenize (CPU-heavy: runs off the event loop)."""
        self.ctx, self.req = ctx, req
        self.prompt_text = render_prompt(ctx, req)
        refuse_text_that_cannot_fit(ctx.tokenizer, self.prompt_text, ctx.ready, "messages")
        ids = ctx.tokenizer.encode(self.prompt_text, add_special_tokens=False)
        top = req.top_logprobs if req.top_logprobs is not None else 0
        params = build_params(
            req,
            ctx.ready,
            req.max_completion_tokens or req.max_tokens,
            top if req.logprobs else None,
        )
        self.gen = Generation(
            ctx, [ids], params, "chatcmpl", ticket, req.kv_transfer_params, req.stream
        )
        use_tools = bool(req.tools) and req.tool_choice != "none"
        self.tool_parser = ctx.tool_call_parser if use_tools else None

    def splitter(self) -> ChatOutputSplitter:
        return ChatOutputSplitter(self.ctx.reasoning_parser, self.tool_parser, self.prompt_text)

    def _head(self) -> dict[str, Any]:
        return {"id": self.gen.id, "created": self.gen.created, "model": self.ctx.served_model_name}

    async def full_response(self) -> dict[str, Any]:
        await self.gen.collect()
        choices = []
        for c in self.gen.choices:
            st = c.state
            assert st is not None
            reasoning, content, calls = self.splitter().split_all(st.text)
            message: dict[str, Any] = {"role": "assistant", "content": content or None}
            if not calls and message["content"] is None:
                message["content"] = ""
            if self.ctx.reasoning_parser:
                message["reasoning_content"] = reasoning or None
            message["tool_calls"] = calls
            lps = chat_logprobs(self.ctx.tokenizer, st.logprobs) if self.req.logprobs else None
            finish = "tool_calls" if calls else st.finish_reason
            choices.append({"index": c.index, "message": message, "logprobs": lps,
                            "finish_reason": finish, "stop_reason": st.stop_reason})  # fmt: skip
        return {**self._head(), "object": "chat.completion", "choices": choices,
                "usage": self.gen.usage(), **self.gen.answer_fields()}  # fmt: skip

    async def stream_chunks(self) -> AsyncIterator[dict[str, Any]]:
        head = {**self._head(), "object": "chat.completion.chunk"}

        def chunk(index: int, delta: dict, **extra: Any) -> dict[str, Any]:
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
            return {**head, "choices": [{**choice, **extra}]}

        splitters = {c.index: self.splitter() for c in self.gen.choices}
        for c in self.gen.choices:
            yield chunk(c.index, {"role": "assistant", "content": ""})
        async for d in self.gen.deltas():
            sp, index = splitters[d.choice.index], d.choice.index
            reasoning, content = sp.feed(d.text)
            lps = chat_logprobs(self.ctx.tokenizer, d.logprobs) if self.req.logprobs else None
            if reasoning:
                yield chunk(index, {"reasoning_content": reasoning})
            if content or lps:
                yield chunk(index, {"content": content}, logprobs=lps)
            if d.finish_reason is None:
                continue
            reasoning, content, calls = sp.finish()
            if reasoning:
                yield chunk(index, {"reasoning_content": reasoning})
            if content:
                yield chunk(index, {"content": content})
            if calls:
                yield chunk(index, {"tool_calls": [{"index": i, **call}
                                                   for i, call in enumerate(calls)]})  # fmt: skip
            finish = "tool_calls" if calls else d.finish_reason
            yield chunk(index, {}, finish_reason=finish, stop_reason=d.choice.state.stop_reason)
        if self.req.stream_options is not None and self.req.stream_options.include_usage:
            yield {**head, "choices": [], "usage": self.gen.usage()}
