"""Where a decode engine fetches a request's KV: the prefill worker's bootstrap address and the
room (the prefill engine's request id). Crosses HTTP as ``kv_transfer_params`` (vLLM's field
name) and the API -> engine pipe as a msgspec struct."""

from __future__ import annotations

from typing import Any

import msgspec


class RemotePrefill(msgspec.Struct):
    host: str
    port: int
    room: str
    backend: str

    def to_params(self) -> dict[str, Any]:
        return {"remote_host": self.host, "remote_port": self.port, "remote_room": self.room,
                "remote_backend": self.backend}  # fmt: skip


def parse_kv_transfer_params(params: dict[str, Any]) -> RemotePrefill:
    """The handle in a request's ``kv_transfer_params``; ValueError naming what is wrong."""
    host, port = params.get("remote_host"), params.get("remote_port")
    room, backend = params.get("remote_room"), params.get("remote_backend")
    if not isinstance(host, str) or not host:
        raise ValueError("kv_transfer_params.remote_host must be a host name")
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise ValueError("kv_transfer_params.remote_port must be a port number")
    if not isinstance(room, str) or not room or len(room) > 256:
        raise ValueError("kv_transfer_params.remote_room must be a non-empty string")
    if not isinstance(backend, str) or not backend:
        raise ValueError("kv_transfer_params.remote_backend must name a transfer backend")
    return RemotePrefill(host, port, room, backend)
