"""The bootstrap channel: a small threaded TCP server in the prefill engine process that hands
each held room to the one decode engine that asks for it, and the decode side's fetch.

    decode -> prefill   {"room": ROOM, "backend": NAME}
    prefill -> decode   {"ok": false, "error": ...}  or the backend's reply and pages
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
import time

from kvserve.disagg.blob import PrefilledKV
from kvserve.disagg.framing import TransferError, recv_msg, send_msg
from kvserve.disagg.store import HeldKV
from kvserve.disagg.transfer import Transport
from kvserve.errors import ConfigError

log = logging.getLogger("kvserve.disagg")


class BootstrapServer:
    def __init__(self, host: str, port: int, held: HeldKV, transport: Transport,
                 timeout_s: float) -> None:  # fmt: skip
        self.held, self.transport, self.timeout_s = held, transport, timeout_s
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                outer.serve_one(self.request)

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        try:
            self.server = socketserver.ThreadingTCPServer(("0.0.0.0", port), Handler)
        except OSError as exc:
            raise ConfigError(f"cannot listen on bootstrap port {port}: {exc.strerror}") from None
        self.server.daemon_threads = True
        self.server.service_actions = held.expire  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.5,),
                                       name="kvserve-bootstrap", daemon=True)  # fmt: skip
        self.thread.start()
        log.info("bootstrap server on %s:%d (%s)", host, port, transport.name)

    def serve_one(self, conn: socket.socket) -> None:
        conn.settimeout(self.timeout_s)
        try:
            ask = recv_msg(conn)
            room, backend = str(ask.get("room")), ask.get("backend")
            if backend != self.transport.name:
                send_msg(conn, {"ok": False, "error": f"this prefill worker transfers with "
                                f"{self.transport.name}, not {backend}"})  # fmt: skip
                return
            blob = self.held.take(room)
            if blob is None:
                send_msg(conn, {"ok": False, "error": f"no KV held for room {room!r} (never "
                                "prefilled here, already fetched, or expired)"})  # fmt: skip
                return
            try:
                started = time.perf_counter()
                blob.wait_ready()  # the capture's device-to-host copies
                ready = time.perf_counter()
                self.transport.send_pages(conn, blob)
                # the wire: from the header out until the backend is done with the pages
                blob.seconds.update(copy_wait=ready - started, wire=time.perf_counter() - ready)
            finally:
                blob.release(blob.ready)
            _log_sent(blob)
        except (OSError, TransferError, ValueError) as exc:
            log.warning("a KV transfer from this prefill worker failed: %r", exc)

    def put(self, blob: PrefilledKV) -> None:
        self.held.put(blob)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _log_sent(blob: PrefilledKV) -> None:
    # benchmarks/pd_serving.py reads these lines: where the prefill side's time went
    s = blob.seconds
    log.info("kv send %s: %d bytes, capture %.6f s (engine thread), held %.6f s, copy wait "
             "%.6f s, wire %.6f s", blob.header.room, blob.header.nbytes, s.get("capture", 0.0),
             s.get("held", 0.0), s.get("copy_wait", 0.0), s.get("wire", 0.0))  # fmt: skip


def fetch(host: str, port: int, room: str, transport: Transport, timeout_s: float) -> PrefilledKV:
    """The held KV of ``room`` from a prefill worker's bootstrap port, within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection((host, port), timeout=min(timeout_s, 10.0)) as conn:
            conn.settimeout(timeout_s)
            send_msg(conn, {"room": room, "backend": transport.name})
            return transport.recv_pages(conn, deadline)
    except TimeoutError:
        raise TransferError(f"the KV transfer from {host}:{port} timed out") from None
    except OSError as exc:
        raise TransferError(f"the KV transfer from {host}:{port} failed: {exc}") from None
