"""A request's prefill/decode side on a server started with ``--disaggregation-mode``: what
the request may carry, what the engine is asked, and what the answer adds.

prefill: one prompt, n 1, no streaming (the router asks); the engine runs it with max_tokens
1 and holds the KV; the answer carries ``kv_transfer_params`` naming where to fetch it.
decode: with ``kv_transfer_params`` the engine fetches the KV instead of prefilling; without,
the request is served as on a normal server. A normal server refuses the field."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvserve.config import DisaggConfig
from kvserve.disagg.handle import RemotePrefill, parse_kv_transfer_params
from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.server.errors import APIError

FIELD = "kv_transfer_params"


def remote_prefill(disagg: DisaggConfig, kv_params: dict[str, Any] | None, num_choices: int,
                   stream: bool) -> RemotePrefill | None:  # fmt: skip
    """Checks the request against the server's mode; the handle to fetch from (decode)."""
    mode = disagg.disaggregation_mode
    if mode == "null":
        if kv_params is not None:
            raise APIError(400, f"{FIELD} is only accepted by a decode worker "
                           "(--disaggregation-mode decode)", FIELD)  # fmt: skip
        return None
    if (mode == "prefill" or kv_params is not None) and num_choices != 1:
        raise APIError(400, f"a {mode} worker serves one prompt with n 1", "n")
    if mode == "prefill":
        if stream:
            raise APIError(400, "a prefill worker answers without streaming", "stream")
        return None
    if kv_params is None:
        return None
    try:
        return parse_kv_transfer_params(kv_params)
    except ValueError as exc:
        raise APIError(400, str(exc), FIELD) from None


def engine_params(disagg: DisaggConfig, params: SamplingParams) -> SamplingParams:
    """A prefill worker samples the first token only; its stop rules apply on the decode side."""
    if disagg.disaggregation_mode != "prefill":
        return params
    return replace(params, max_tokens=1, min_tokens=0)


def answer_fields(disagg: DisaggConfig, request_ids: list[str]) -> dict[str, Any]:
    """What a prefill worker's answer adds: where the decode worker fetches the KV."""
    if disagg.disaggregation_mode != "prefill":
        return {}
    handle = RemotePrefill(disagg.disaggregation_bootstrap_host,
                           disagg.disaggregation_bootstrap_port, request_ids[0],
                           disagg.disaggregation_transfer_backend)  # fmt: skip
    return {FIELD: handle.to_params()}
