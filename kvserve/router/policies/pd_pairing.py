"""Prefill/decode pairing: one prefill and one decode worker per request, each chosen by its own
policy (round robin for both by default, as the field runs its 2P2D deployments). The PD
forwarder (the request to the prefill worker, the KV handoff, the stream from the decode
worker) comes with the engine's KV transfer; this is only the selection."""

from __future__ import annotations

from collections.abc import Sequence

from kvserve.router.policies.base import Policy, RouteRequest
from kvserve.router.worker import Worker


class PDPairPolicy:
    name = "pd"

    def __init__(self, prefill: Policy, decode: Policy) -> None:
        self.prefill, self.decode = prefill, decode
        self.needs_key = prefill.needs_key or decode.needs_key

    def select_pair(self, prefill: Sequence[Worker], decode: Sequence[Worker],
                    request: RouteRequest) -> tuple[Worker, Worker]:  # fmt: skip
        """Callers pass non-empty lists of routable workers of each role."""
        return self.prefill.select(prefill, request), self.decode.select(decode, request)
