"""The checks every prompt passes before it is queued, shared by the engine core and the API
process (which checks against the limits the engine announced)."""

from __future__ import annotations

from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.errors import InvalidRequestError


def check_prompt(
    prompt_token_ids: list[int], params: SamplingParams, context_length: int, vocab_size: int
) -> int:
    """Raises ``InvalidRequestError`` for an empty prompt, an id outside the vocabulary or a
    prompt + max_tokens beyond the context; returns the resolved max_tokens."""
    n = len(prompt_token_ids)
    if n == 0:
        raise InvalidRequestError("the prompt is empty", param="prompt")
    bad = next((t for t in prompt_token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidRequestError(
            f"token id {bad} is outside the vocabulary (0..{vocab_size - 1})", param="prompt"
        )
    room = context_length - n
    if room < 1:  # the prompt alone is too long, whatever max_tokens says
        raise InvalidRequestError(
            f"the prompt has {n} tokens, which leaves no room in the context length "
            f"of {context_length}",
            param="prompt",
        )
    if params.max_tokens is None:
        return room
    if params.max_tokens > room:
        raise InvalidRequestError(
            f"prompt ({n} tokens) + max_tokens ({params.max_tokens}) = "
            f"{n + params.max_tokens} exceeds the context length of {context_length}",
            param="max_tokens",
        )
    return params.max_tokens
