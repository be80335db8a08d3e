"""Admission: one ``Ticket`` per HTTP request that generates, taken after the request passed
validation and before any tokenization. It reserves the request's engine requests in the
client's ledger at once (so a burst is counted as it arrives, streaming or not), hands one
reservation to each engine request it sends, and ``close()`` (idempotent, called on every exit
path: response done, error, disconnect, cancellation) gives back what was never sent and
aborts what is still running."""

from __future__ import annotations

import asyncio

from kvserve.disagg.handle import RemotePrefill
from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.engine.ipc.core_client import CoreClient
from kvserve.server.context import ServerContext
from kvserve.server.errors import APIError


class Ticket:
    def __init__(self, client: CoreClient, num_requests: int) -> None:
        self.client = client
        self.num_unsent = num_requests
        self.sent: list[str] = []
        self.closed = False
        client.reserve(num_requests)

    def send(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        queue: asyncio.Queue,
        remote: RemotePrefill | None = None,
    ) -> None:
        if self.closed or self.num_unsent < 1:
            raise RuntimeError("the ticket has no reservation left")
        self.client.add(request_id, prompt, params, queue, remote)
        self.num_unsent -= 1
        self.sent.append(request_id)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.client.unreserve(self.num_unsent)
        self.num_unsent = 0
        still_live = [rid for rid in self.sent if rid in self.client.live]
        if still_live:
            self.client.abort(still_live)


def admit(ctx: ServerContext, num_requests: int) -> Ticket:
    """A ticket for ``num_requests`` engine requests, or 503 (engine gone, draining) / 429
    (``--max-queued-requests`` would be exceeded)."""
    client = ctx.client
    if client.dead is not None:
        raise APIError(503, f"the engine is not running: {client.dead}")
    if ctx.draining:
        raise APIError(503, "the server is shutting down")
    limit = ctx.max_queued_requests
    if limit is not None:
        queued = client.num_queued_if_admitted(num_requests, ctx.ready.max_running_requests)
        if queued > limit:
            raise APIError(
                429, f"too many requests waiting ({max(0, queued - num_requests)}; the limit "
                f"is {limit}); retry later",
            )  # fmt: skip
    return Ticket(client, num_requests)
