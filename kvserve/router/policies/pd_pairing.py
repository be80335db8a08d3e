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


def select_pd_pair(workers: Sequence[Worker], policy: PDPairPolicy,
                   request: RouteRequest) -> tuple[Worker, Worker] | None:  # fmt: skip
    """A pair from the routable workers of each role; None when either role has none (the
    caller answers 503). Regular workers never join a pair."""
    prefill = [w for w in workers if w.spec.role == "prefill" and w.routable]
    decode = [w for w in workers if w.spec.role == "decode" and w.routable]
    if not prefill or not decode:
        return None
    return policy.select_pair(prefill, decode, request)
