"""Length-prefixed msgpack messages over a blocking socket: the bootstrap control channel."""

from __future__ import annotations

import socket
import struct
from typing import Any

import msgspec

_LEN = struct.Struct("!I")
MAX_MESSAGE = 64 << 20


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
