"""The NIXL backend (NVIDIA's inference transfer library, UCX underneath: RDMA or NVLink where
present, shared memory or TCP otherwise). The decode side READs the pages one-sidedly from
the prefill side's registered host buffer; the bootstrap connection carries the agent
metadata and descriptors, and the decode side's "done" that lets the prefill side unregister."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from typing import Any

from kvserve.disagg.blob import PrefilledKV, empty_pages, encode_header, pages_from_raw
from kvserve.disagg.framing import TransferError, recv_msg, send_msg
from kvserve.disagg.transfer_tcp import accept_reply


def nixl_agent_class() -> tuple[Any, Any]:
    from nixl._api import nixl_agent, nixl_agent_config

    return nixl_agent, nixl_agent_config


class NixlTransport:
    name = "nixl"

    def __init__(self) -> None:
        agent_cls, config_cls = nixl_agent_class()
        self.agent = agent_cls(f"kvserve-{os.getpid()}-{uuid.uuid4().hex[:8]}",
                               config_cls(backends=["UCX"]))  # fmt: skip
        self.lock = threading.Lock()  # one agent, used from several transfer threads
        self.peers: set[str] = set()

    def send_pages(self, conn: socket.socket, blob: PrefilledKV) -> None:
        raw = blob.raw()
        with self.lock:
            reg = self.agent.register_memory(raw)
            descs = self.agent.get_serialized_descs(self.agent.get_xfer_descs(raw))
            meta = self.agent.get_agent_metadata()
        try:
            send_msg(conn, {"ok": True, "header": encode_header(blob.header),
                            "agent": meta, "descs": descs})  # fmt: skip
            if not recv_msg(conn).get("done"):
                raise TransferError("the decode side did not confirm the transfer")
        finally:
            with self.lock:
                self.agent.deregister_memory(reg)

    def recv_pages(self, conn: socket.socket, deadline: float) -> PrefilledKV:
        started = time.perf_counter()
        reply = recv_msg(conn)
        header = accept_reply(reply)
        got_header = time.perf_counter()
        raw = empty_pages(header)
        with self.lock:
            reg = self.agent.register_memory(raw)
            peer = self._peer(reply["agent"])
            remote = self.agent.deserialize_descs(reply["descs"])
            xfer = self.agent.initialize_xfer("READ", self.agent.get_xfer_descs(raw), remote, peer)
            state = self.agent.transfer(xfer)
        try:
            while state != "DONE":
                if state == "ERR":
                    raise TransferError("NIXL reported a failed transfer")
                if time.monotonic() > deadline:
                    raise TransferError("the KV transfer timed out")
                time.sleep(0.0005)
                with self.lock:
                    state = self.agent.check_xfer_state(xfer)
        finally:
            with self.lock:
                self.agent.release_xfer_handle(xfer)
                self.agent.deregister_memory(reg)
        send_msg(conn, {"done": True})
        blob = PrefilledKV(header, pages_from_raw(header, raw))
        blob.seconds.update(header=got_header - started, wire=time.perf_counter() - got_header)
        return blob

    def _peer(self, metadata: bytes) -> str:
        name = self.agent.add_remote_agent(metadata)
        name = name.decode() if isinstance(name, bytes) else name
        self.peers.add(name)
        return name
