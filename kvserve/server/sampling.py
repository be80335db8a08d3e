"""OpenAI request fields -> ``SamplingParams``, with the model's generation_config defaults
for fields the request leaves out."""

from __future__ import annotations

from typing import Any

from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.engine.ipc.messages import Ready
from kvserve.errors import InvalidRequestError
from kvserve.server.errors import APIError
from kvserve.server.protocol import SamplingFields

_DEFAULTED = ("temperature", "top_p", "top_k", "repetition_penalty")
_PASSED = ("n", "min_p", "seed", "presence_penalty", "frequency_penalty", "ignore_eos",
           "min_tokens", "include_stop_str_in_output", "skip_special_tokens")  # fmt: skip


def build_params(
    req: SamplingFields, ready: Ready, max_tokens: int | None, logprobs: int | None
) -> SamplingParams:
    fields: dict[str, Any] = {}
    for name in _DEFAULTED:
        value = getattr(req, name)
        fields[name] = value if value is not None else getattr(ready, name)
    for name in _PASSED:
        fields[name] = getattr(req, name)
    fields = {k: v for k, v in fields.items() if v is not None}
    stop = req.stop if req.stop is not None else []
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            stop=[stop] if isinstance(stop, str) else list(stop),
            stop_token_ids=list(req.stop_token_ids or []),
            logprobs=logprobs,
            **fields,
        )
    except InvalidRequestError as exc:
        raise APIError.from_invalid(exc) from exc
