"""Request checks the API process makes before anything reaches the engine, against the
limits the engine announced in its ``Ready`` message (the engine's own checks, as 400s)."""

from __future__ import annotations

from kvserve.engine.core.prompt_checks import check_prompt as engine_check_prompt
from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.engine.ipc.messages import Ready
from kvserve.errors import InvalidRequestError
from kvserve.server.errors import APIError


def check_prompt(ids: list[int], params: SamplingParams, ready: Ready) -> None:
    try:
        engine_check_prompt(ids, params, ready.context_length, ready.vocab_size)
    except InvalidRequestError as exc:
        raise APIError.from_invalid(exc) from None
