"""Length-prefixed msgpack messages over a blocking socket: the bootstrap control channel."""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import msgspec

_LEN = struct.Struct("!I")
MAX_MESSAGE = 64 << 20
BULK_SLICE = 64 << 20  # bytes per send/recv call in the bulk phase
_TIMEVAL = struct.Struct("@ll")


class TransferError(Exception):
    """A KV transfer failed (peer gone, timed out, refused, or the pages do not fit)."""


def send_msg(sock: socket.socket, message: dict[str, Any]) -> None:
    data = msgspec.msgpack.encode(message)
    sock.sendall(_LEN.pack(len(data)) + data)


def recv_exact(sock: socket.socket, buf: memoryview) -> None:
    got = 0
    while got < len(buf):
        n = sock.recv_into(buf[got:])
        if n == 0:
            raise TransferError("the peer closed the connection mid-transfer")
        got += n


def recv_msg(sock: socket.socket) -> dict[str, Any]:
    head = bytearray(_LEN.size)
    recv_exact(sock, memoryview(head))
    (size,) = _LEN.unpack(head)
    if size > MAX_MESSAGE:
        raise TransferError(f"control message of {size} bytes is over the limit")
    body = bytearray(size)
    recv_exact(sock, memoryview(body))
    message = msgspec.msgpack.decode(bytes(body))
    if not isinstance(message, dict):
        raise TransferError("malformed control message")
    return message


# The bulk phase runs the socket in blocking mode with the kernel's own timeouts instead of
# Python's (which make the socket non-blocking: one syscall, poll and GIL round trip per
# socket-buffer's worth of bytes, a few hundred KB). Blocking, one call moves BULK_SLICE bytes
# with the GIL released, so a busy engine thread in the same process barely slows it.


def send_bulk(sock: socket.socket, data: memoryview, deadline: float) -> None:
    with _blocking(sock):
        sent = 0
        while sent < len(data):
            _kernel_timeout(sock, socket.SO_SNDTIMEO, deadline)
            with contextlib.suppress(BlockingIOError):  # the kernel timeout: check the deadline
                sent += sock.send(data[sent : sent + BULK_SLICE])


def recv_bulk(sock: socket.socket, buf: memoryview, deadline: float) -> None:
    with _blocking(sock):
        got = 0
        while got < len(buf):
            _kernel_timeout(sock, socket.SO_RCVTIMEO, deadline)
            try:
                n = sock.recv_into(buf[got : got + BULK_SLICE], 0, socket.MSG_WAITALL)
            except BlockingIOError:
                continue
            if n == 0:
                raise TransferError("the peer closed the connection mid-transfer")
            got += n


@contextlib.contextmanager
def _blocking(sock: socket.socket) -> Iterator[None]:
    old = sock.gettimeout()
    sock.settimeout(None)
    try:
        yield
    finally:
        for opt in (socket.SO_SNDTIMEO, socket.SO_RCVTIMEO):
            sock.setsockopt(socket.SOL_SOCKET, opt, _TIMEVAL.pack(0, 0))
        sock.settimeout(old)


def _kernel_timeout(sock: socket.socket, opt: int, deadline: float) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TransferError("the KV transfer timed out")
    left = max(left, 0.001)
    sock.setsockopt(socket.SOL_SOCKET, opt, _TIMEVAL.pack(int(left), int(left % 1 * 1e6)))
