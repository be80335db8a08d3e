"""Typed results that cross from the engine core to its callers (in-process or over ZeroMQ):
msgspec structs, so they serialise without pickle."""

from __future__ import annotations

import msgspec


class TokenLogprobs(msgspec.Struct, array_like=True):
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), best first; empty unless asked


class EngineCoreOutput(msgspec.Struct, array_like=True):
    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprobs] | None
    finish_reason: str | None  # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None
    num_prompt_tokens: int
    num_cached_tokens: int
