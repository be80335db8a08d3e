"""Operator limits on one request (``--max-n``, ``--max-prompts-per-request``,
``--max-stop-strings``, ``--max-prompt-bytes``, ``--default-max-tokens``), checked before the
request is admitted, tokenized or counted anywhere: a 400 naming the field."""

from __future__ import annotations

from dataclasses import dataclass

from kvserve.engine.ipc.messages import Ready
from kvserve.server.errors import APIError
from kvserve.server.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingFields,
)


@dataclass(frozen=True)
class RequestLimits:
    max_n: int = 16
    max_prompts: int = 64
    max_stop_strings: int = 16
    max_prompt_bytes: int = 8 << 20
    default_max_tokens: int = 4096

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")


def _too_many(what: str, got: int, limit: int, flag: str, param: str) -> APIError:
    return APIError(400, f"{what}: {got} is over this server's limit of {limit} ({flag})", param)


def check_sampling(req: SamplingFields, limits: RequestLimits, ready: Ready) -> None:
    if req.n > limits.max_n:
        raise _too_many("n", req.n, limits.max_n, "--max-n", "n")
    stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    if len(stops) > limits.max_stop_strings:
        raise _too_many("stop strings", len(stops), limits.max_stop_strings,
                        "--max-stop-strings", "stop")  # fmt: skip
    bad = next((t for t in req.stop_token_ids or [] if t >= ready.vocab_size), None)
    if bad is not None:
        raise APIError(400, f"stop token id {bad} is outside the vocabulary "
                       f"(0..{ready.vocab_size - 1})", "stop_token_ids")  # fmt: skip


def check_prompt_bytes(texts: list[str], limits: RequestLimits, param: str) -> None:
    size = sum(len(t.encode()) for t in texts)
    if size > limits.max_prompt_bytes:
        raise APIError(400, f"the prompt text is {size} bytes, over this server's limit of "
                       f"{limits.max_prompt_bytes} (--max-prompt-bytes)", param)  # fmt: skip


def prompt_list(req: CompletionRequest) -> list[str] | list[list[int]]:
    """The request's prompts as a list, one entry per prompt."""
    p = req.prompt
    if isinstance(p, str):
        return [p]
    if p and isinstance(p[0], int):
        return [p]  # type: ignore[list-item]
    return p  # type: ignore[return-value]


def check_completion(req: CompletionRequest, limits: RequestLimits, ready: Ready) -> int:
    """Checks the completion request's limits; returns how many engine requests it makes."""
    check_sampling(req, limits, ready)
    prompts = prompt_list(req)
    if len(prompts) > limits.max_prompts:
        raise _too_many("prompts", len(prompts), limits.max_prompts,
                        "--max-prompts-per-request", "prompt")  # fmt: skip
    texts = [p for p in prompts if isinstance(p, str)]
    check_prompt_bytes(texts, limits, "prompt")
    for ids in prompts:
        if not isinstance(ids, str) and len(ids) > ready.context_length:
            raise APIError(400, f"the prompt has {len(ids)} tokens, more than the context "
                           f"length of {ready.context_length}", "prompt")  # fmt: skip
    return len(prompts) * req.n


def message_texts(messages: list[ChatMessage]) -> list[str]:
    out = []
    for m in messages:
        if isinstance(m.content, str):
            out.append(m.content)
        elif m.content is not None:
            out.extend(part.text for part in m.content)
        out.extend(c.function.arguments for c in m.tool_calls or [])
    return out


def check_chat(req: ChatCompletionRequest, limits: RequestLimits, ready: Ready) -> int:
    check_sampling(req, limits, ready)
    check_prompt_bytes(message_texts(req.messages), limits, "messages")
    return req.n
