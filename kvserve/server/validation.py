"""Request checks the API process makes before anything reaches the engine, against the
limits the engine announced in its ``Ready`` message."""

from __future__ import annotations

from kvserve.engine.messages import Ready
from kvserve.engine.sampling_params import SamplingParams
from kvserve.server.errors import APIError


def check_prompt(ids: list[int], params: SamplingParams, ready: Ready) -> None:
    n, ctx = len(ids), ready.context_length
    if n == 0:
        raise APIError(400, "the prompt is empty", "prompt")
    bad = next((t for t in ids if not 0 <= t < ready.vocab_size), None)
    if bad is not None:
        raise APIError(
            400, f"token id {bad} is outside the vocabulary (0..{ready.vocab_size - 1})", "prompt"
        )
    if params.max_tokens is None:
        if n >= ctx:
            raise APIError(
                400,
                f"the prompt has {n} tokens, which leaves no room in the context length of {ctx}",
                "messages",
            )
        return
    if n + params.max_tokens > ctx:
        raise APIError(
            400,
            f"this model's context length is {ctx} tokens, but the request asks for "
            f"{n + params.max_tokens} tokens: prompt ({n} tokens) + max_tokens "
            f"({params.max_tokens})",
            "max_tokens",
        )
