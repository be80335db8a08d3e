"""A lean HTTP/1.1 client for the router's upstream calls: keep-alive connections pooled per
worker, the request written in one piece, the response head parsed by hand, the body handed
on piece by piece as the worker sent it (chunked or sized). aiohttp's client costs more CPU
per request than the whole rest of the router; this is the hot path of every request.

Errors: `UpstreamError` before the response head (kind "connect" or "disconnect"; the
request did not start for the client), `StreamBroken` while the body streams."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urlsplit


class UpstreamError(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


class StreamBroken(Exception):
    pass


_BROKEN = (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, OSError,
           ValueError)  # fmt: skip


class Connection:
    __slots__ = ("reader", "writer", "reused")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.reused = reader, writer, False

    def close(self) -> None:
        self.writer.close()


class Response:
    """Status and headers arrived; the body is read with `read()` or `chunks()`, after which
    the connection goes back to the pool. `close()` drops it (an abort for the worker)."""

    def __init__(self, pool: Pool, key: str, conn: Connection, status: int,
                 headers: dict[str, str]) -> None:  # fmt: skip
        self.pool, self.key, self.conn = pool, key, conn
        self.status, self.headers = status, headers
        self.chunked = "chunked" in headers.get("transfer-encoding", "")
        length = headers.get("content-length")
        self.length = int(length) if length is not None and length.isdigit() else None
        self.keep_alive = headers.get("connection", "").lower() != "close"
        self.done = self.last = False

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives: each piece is everything complete that one socket read
        brought (several SSE events when the worker sent them together), so the client gets
        each event as soon as the router has it, in as few writes as possible. `last` is true
        while the piece handed out is the body's end (the caller can end its answer in the
        same write)."""
        try:
            if self.chunked:
                async for piece, last in _dechunk(self.conn.reader):
                    self.last = last
                    if piece:
                        yield piece
            elif self.length is not None:
                left = self.length
                while left:
                    data = await self.conn.reader.read(min(left, 1 << 16))
                    if not data:
                        raise asyncio.IncompleteReadError(b"", left)
                    left -= len(data)
                    self.last = not left
                    yield data
            else:  # body until the worker closes the connection
                while data := await self.conn.reader.read(1 << 16):
                    yield data
                self.keep_alive = False
        except _BROKEN as exc:
            self.close()
            raise StreamBroken(type(exc).__name__) from None
        self.done = True
        if self.keep_alive:
            self.pool.release(self.key, self.conn)
        else:
            self.conn.close()

    async def read(self) -> bytes:
        return b"".join([piece async for piece in self.chunks()])

    def close(self) -> None:
        if not self.done:
            self.done = True
            self.conn.close()


async def _dechunk(reader: asyncio.StreamReader) -> AsyncIterator[tuple[bytes, bool]]:
    """Transfer-Encoding: chunked -> (payload, finished) pieces, one per socket read that
    completed at least one chunk or the body; `finished` once the last (empty) chunk was read,
    with the payload that came in the same read. No trailers (OpenAI servers send none)."""
    buf = bytearray()
    while True:
        out, finished = [], False
        while (eol := buf.find(b"\r\n")) >= 0:
            size = int(bytes(buf[:eol]).split(b";", 1)[0], 16)
            end = eol + 2 + size + 2
            if len(buf) < end:
                break
            if size == 0:
                finished = True
                break
            out.append(bytes(buf[eol + 2 : end - 2]))
            del buf[:end]
        if out or finished:
            yield b"".join(out), finished
        if finished:
            return
        data = await reader.read(1 << 16)
        if not data:
            raise asyncio.IncompleteReadError(bytes(buf), None)
        buf += data


class Pool:
    def __init__(self, connect_timeout_s: float) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.idle: dict[str, list[Connection]] = {}
        self.addresses: dict[str, tuple[str, int, str]] = {}

    def _address(self, base_url: str) -> tuple[str, int, str]:
        addr = self.addresses.get(base_url)
        if addr is None:
            parts = urlsplit(base_url)
            if parts.scheme != "http":
                raise UpstreamError("connect", "only http:// workers are supported")
            port = parts.port or 80
            addr = self.addresses[base_url] = (parts.hostname or "", port, parts.netloc)
        return addr

    async def _connect(self, key: str) -> Connection:
        idle = self.idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.writer.is_closing() and not conn.reader.at_eof():
                conn.reused = True
                return conn
            conn.close()
        host, port, _ = self._address(key)
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, limit=1 << 20), self.connect_timeout_s
            )
        except (TimeoutError, OSError) as exc:
            raise UpstreamError("connect", type(exc).__name__) from None
        return Connection(reader, writer)

    def forget(self, base_url: str) -> None:
        """Closes the idle connections to a worker that left the registry."""
        for conn in self.idle.pop(base_url, []):
            conn.close()

    def release(self, key: str, conn: Connection) -> None:
        if conn.writer.is_closing():
            return
        self.idle.setdefault(key, []).append(conn)

    async def request(self, base_url: str, method: str, path: str, body: bytes | None,
                      headers: dict[str, str]) -> Response:  # fmt: skip
        """Sends the request; returns once the response head arrived. A reused keep-alive
        connection that the worker had closed is retried once on a fresh one."""
        netloc = self._address(base_url)[2]
        head = [f"{method} {path} HTTP/1.1\r\nHost: {netloc}\r\n"]
        head += [f"{k}: {v}\r\n" for k, v in headers.items()]
        if body is not None:
            head.append(f"Content-Length: {len(body)}\r\n")
        payload = "".join(head).encode("latin-1") + b"\r\n" + (body or b"")
        for _ in range(2):
            conn = await self._connect(base_url)
            try:
                conn.writer.write(payload)
                raw = await conn.reader.readuntil(b"\r\n\r\n")
            except _BROKEN as exc:
                conn.close()
                if conn.reused:
                    continue
                raise UpstreamError("disconnect", type(exc).__name__) from None
            except asyncio.CancelledError:  # the client left: the worker must see it abort
                conn.close()
                raise
            return _parse_head(self, base_url, conn, raw)
        raise UpstreamError("disconnect", "the worker closed the connection")


def _parse_head(pool: Pool, key: str, conn: Connection, raw: bytes) -> Response:
    lines = raw.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError):
        conn.close()
        raise UpstreamError("disconnect", f"not an HTTP answer: {lines[0][:60]!r}") from None
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip()
    return Response(pool, key, conn, status, headers)
