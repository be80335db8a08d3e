"""The plain TCP backend: the pages follow the header on the bootstrap connection itself, as
one stream of raw bytes, sent from and received into reused staging buffers (``staging.py``)
in large blocking calls (``framing.send_bulk`` / ``recv_bulk``)."""

from __future__ import annotations

import socket
import time

from kvserve.disagg.blob import KVHeader, PrefilledKV, decode_header, encode_header, pages_from_raw
from kvserve.disagg.framing import TransferError, recv_bulk, recv_msg, send_bulk, send_msg
from kvserve.disagg.staging import HostStaging


class TcpTransport:
    name = "tcp"

    def __init__(self, staging: HostStaging | None = None) -> None:
        self.staging = staging if staging is not None else HostStaging(0)  # 0: one-off buffers

    def send_pages(self, conn: socket.socket, blob: PrefilledKV) -> None:
        deadline = time.monotonic() + (conn.gettimeout() or 3600.0)
        send_msg(conn, {"ok": True, "header": encode_header(blob.header)})
        send_bulk(conn, memoryview(blob.raw().numpy()), deadline)

    def recv_pages(self, conn: socket.socket, deadline: float) -> PrefilledKV:
        started = time.perf_counter()
        header = accept_reply(recv_msg(conn))
        got_header = time.perf_counter()
        staged = self.staging.take(header.nbytes)
        try:
            recv_bulk(conn, memoryview(staged.data.numpy()), deadline)
        except BaseException:
            staged.give_back()
            raise
        blob = PrefilledKV(header, pages_from_raw(header, staged.data), staged)
        blob.seconds.update(header=got_header - started, wire=time.perf_counter() - got_header)
        return blob


def accept_reply(reply: dict) -> KVHeader:
    """The header of a positive bootstrap reply; TransferError with the sender's reason else."""
    if not reply.get("ok"):
        raise TransferError(str(reply.get("error", "the prefill worker refused the transfer")))
    return decode_header(reply["header"])
