"""The plain TCP backend: the pages follow the header on the bootstrap connection itself, as
one stream of raw bytes received straight into a host buffer."""

from __future__ import annotations

import socket
import time

from kvserve.disagg.blob import (
    PrefilledKV,
    decode_header,
    empty_pages,
    encode_header,
    pages_from_raw,
)
from kvserve.disagg.framing import TransferError, recv_exact, recv_msg, send_msg


class TcpTransport:
    name = "tcp"

    def send_pages(self, conn: socket.socket, blob: PrefilledKV) -> None:
        send_msg(conn, {"ok": True, "header": encode_header(blob.header)})
        conn.sendall(memoryview(blob.raw().numpy()))

    def recv_pages(self, conn: socket.socket, deadline: float) -> PrefilledKV:
        reply = recv_msg(conn)
        header = accept_reply(reply)
        raw = empty_pages(header)
        view = memoryview(raw.numpy())
        step = 1 << 24  # check the deadline between slices
        for start in range(0, len(view), step):
            if time.monotonic() > deadline:
                raise TransferError("the KV transfer timed out")
            recv_exact(conn, view[start : start + step])
        return PrefilledKV(header, pages_from_raw(header, raw))


def accept_reply(reply: dict):  # noqa: ANN201 - KVHeader
    """The header of a positive bootstrap reply; TransferError with the sender's reason else."""
    if not reply.get("ok"):
        raise TransferError(str(reply.get("error", "the prefill worker refused the transfer")))
    return decode_header(reply["header"])
