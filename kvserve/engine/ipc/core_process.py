"""The engine core in its own process: ``python -m kvserve.engine.ipc.core_process``.

It loads the model, sends ``Ready`` and loops: take every queued message (blocking only while
idle), ``step()``, send the step's outputs with a stats snapshot. It only ever sends on a PUSH
socket, so it never waits on the API process; it exits when told to, or when its parent dies
(``parent_watch``: checked on every iteration, busy or idle), removing the socket folder then.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from pathlib import Path

import msgspec
import zmq

from kvserve.config import EngineConfig
from kvserve.engine.core.request import Request
from kvserve.engine.engine_core import EngineCore
from kvserve.engine.ipc.messages import (
    AbortRequests,
    AddRequest,
    Fatal,
    OutputBatch,
    Ready,
    RequestFailed,
    Shutdown,
    StopRequest,
    decode_input,
    encode,
)
from kvserve.engine.ipc.parent_watch import ParentGone, die_with_parent, parent_alive
from kvserve.engine.ipc.socket_dir import is_socket_dir
from kvserve.errors import KVServeError

log = logging.getLogger("kvserve.engine.ipc.core_process")
HEARTBEAT_S = 0.5


class CoreLoop:
    def __init__(
        self, engine: EngineCore, inbox: zmq.Socket, outbox: zmq.Socket, parent_pid: int
    ) -> None:
        self.engine, self.inbox, self.outbox = engine, inbox, outbox
        self.num_added = 0
        self.num_handled = 0  # messages of any kind handled (monotonic)
        self.unscheduled: dict[str, Request] = {}  # added, first output not yet sent
        self.failed: list[RequestFailed] = []
        self.running = True
        self.parent = parent_pid

    def ready_message(self) -> Ready:
        e = self.engine
        d = e.source.generation_defaults
        return Ready(
            pid=os.getpid(),
            model_path=str(e.source.path),
            device=str(e.device),
            dtype=str(e.dtype).removeprefix("torch."),
            context_length=e.context_length,
            vocab_size=e.model_config.vocab_size,
            num_pages=e.kv.num_pages,
            page_size=e.config.cache.page_size,
            kv_cache_dtype=str(e.runner.kv.dtype).removeprefix("torch."),
            kv_bytes_per_token=e.runner.kv.bytes_per_token,
            eos_token_ids=list(e.eos_token_ids),
            max_running_requests=e.config.scheduler.max_running_requests,
            max_queued_requests=e.config.scheduler.max_queued_requests,
            temperature=d.temperature,
            top_p=d.top_p,
            top_k=d.top_k,
            repetition_penalty=d.repetition_penalty,
        )

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.inbox, zmq.POLLIN)
        while self.running:
            if not parent_alive(self.parent):
                raise ParentGone()  # nobody to serve: drop the backlog
            busy = self.engine.has_unfinished()
            if not busy and not poller.poll(HEARTBEAT_S * 1000):
                self.engine.check_health()  # a dead tensor-parallel rank ends the engine
                self.send([])  # heartbeat
                continue
            handled = self.drain()
            if self.engine.has_unfinished():
                self.send(self.engine.step())
            elif handled:
                self.send([])  # gauges move after aborts even with nothing to step

    def drain(self) -> int:
        handled = 0
        while self.running:
            try:
                data = self.inbox.recv(zmq.NOBLOCK)
            except zmq.Again:
                return handled
            handled += 1
            self.num_handled += 1
            self.handle(decode_input(data))
        return handled

    def handle(self, msg: object) -> None:
        e = self.engine
        if isinstance(msg, AddRequest):
            self.num_added += 1
            try:
                e.add_request(msg.request_id, msg.prompt_token_ids, msg.params, remote=msg.remote)
            except KVServeError as exc:
                param = getattr(exc, "param", None)
                self.failed.append(RequestFailed(msg.request_id, str(exc), param))
                return
            self.unscheduled[msg.request_id] = e.requests[msg.request_id]
        elif isinstance(msg, AbortRequests):
            for rid in msg.request_ids:
                e.abort_request(rid)
                self.unscheduled.pop(rid, None)
        elif isinstance(msg, StopRequest):
            e.stop_request(msg.request_id, msg.stop)
        elif isinstance(msg, Shutdown):
            self.running = False

    def send(self, outputs: list) -> None:
        queue_times = {}
        for out in outputs:
            req = self.unscheduled.pop(out.request_id, None)
            if req is not None and req.first_scheduled_time is not None:
                queue_times[out.request_id] = req.first_scheduled_time - req.arrival_time
        if self.engine.disagg is not None:
            for rid, why in self.engine.disagg.take_failed():
                self.unscheduled.pop(rid, None)
                self.failed.append(RequestFailed(rid, why, "kv_transfer_params", 503))
        batch = OutputBatch(outputs, self.engine.stats(), self.num_added, queue_times,
                            self.failed, self.num_handled)  # fmt: skip
        self.failed = []
        self.outbox.send(encode(batch), copy=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvserve.engine.ipc.core_process")
    p.add_argument("--input", required=True, help="ZeroMQ address to PULL requests from")
    p.add_argument("--output", required=True, help="ZeroMQ address to PUSH outputs to")
    p.add_argument("--config", required=True, help="EngineConfig as JSON")
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this process exits")
    p.add_argument("--log-level", default="info")
    a = p.parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), format="%(levelname)s engine: %(message)s")
    parent = a.parent_pid if a.parent_pid is not None else os.getppid()
    ctx = zmq.Context()
    outbox = ctx.socket(zmq.PUSH)
    outbox.setsockopt(zmq.SNDHWM, 0)  # never block the loop on a slow reader
    outbox.setsockopt(zmq.LINGER, 1000)
    inbox = ctx.socket(zmq.PULL)
    inbox.setsockopt(zmq.RCVHWM, 0)
    try:
        die_with_parent(parent)
        outbox.connect(a.output)
        inbox.connect(a.input)
        config = msgspec.json.decode(a.config, type=EngineConfig)
        loop = CoreLoop(EngineCore(config), inbox, outbox, parent)
        outbox.send(encode(loop.ready_message()))
        loop.run()
        loop.engine.close()  # tensor-parallel workers leave with the engine
    except ParentGone:
        log.warning("the API process is gone; exiting")
        _remove_socket_dir(a.input)
        os._exit(3)  # at once: no one is left to report to, and teardown can take seconds
    except KVServeError as exc:
        outbox.send(encode(Fatal(str(exc))))
        log.error("%s", exc)
        return 2
    except Exception as exc:
        outbox.send(encode(Fatal(f"{type(exc).__name__}: {exc}")))
        raise
    finally:
        inbox.close(0)
        outbox.close()
        ctx.term()
    return 0


def _remove_socket_dir(address: str) -> None:
    """The API process cannot remove the socket folder once it is dead: do it here."""
    folder = Path(address.removeprefix("ipc://")).parent
    if address.startswith("ipc://") and is_socket_dir(folder):
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
