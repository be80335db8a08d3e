"""The API process's side of the engine core: spawns ``kvserve.engine.ipc.core_process``, sends it
typed messages and routes its output batches to one asyncio queue per request.

It also keeps the admission ledger: every engine request is counted once, first as reserved
(admitted, being prepared), then as live (sent, not yet finished, failed, aborted or stopped
as far as this process knows). ``admission_check`` compares the ledger with the engine's own
counts whenever no message is in flight: admitted = running + waiting + in preparation."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable

import msgspec
import zmq
import zmq.asyncio

from kvserve.config import EngineConfig
from kvserve.disagg.handle import RemotePrefill
from kvserve.engine.core.outputs import EngineCoreOutput
from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.engine.core.stats import EngineStats
from kvserve.engine.ipc.messages import (
    AbortRequests,
    AddRequest,
    Fatal,
    OutputBatch,
    Ready,
    RequestFailed,
    Shutdown,
    StopRequest,
    decode_output,
    encode,
)
from kvserve.engine.ipc.socket_dir import make_socket_dir
from kvserve.errors import ModelLoadError

log = logging.getLogger("kvserve.engine.ipc.core_client")
QueueItem = EngineCoreOutput | RequestFailed | BaseException


class EngineDeadError(RuntimeError):
    """The engine-core process exited; no request can be served any more."""


class CoreClient:
    def __init__(self, config: EngineConfig, log_level: str = "info") -> None:
        self.config = config
        self.log_level = log_level
        self.ready: Ready | None = None
        self.stats = EngineStats(0, 0, 0.0, 0, 0, 0)
        self.queues: dict[str, asyncio.Queue[QueueItem]] = {}
        self.num_sent_adds = 0
        self.num_engine_adds = 0
        self.num_sent = 0  # messages of any kind sent (the engine reports how many it handled)
        self.num_engine_handled = 0
        self.num_reserved = 0  # admitted engine requests not yet sent (being prepared)
        self.live: set[str] = set()  # sent and, as far as this process knows, in the engine
        self.dead: str | None = None  # why the engine is gone, once it is
        self.last_message = time.monotonic()
        self.on_batch: Callable[[OutputBatch], None] | None = None
        self.on_dead: Callable[[str], None] | None = None
        self._tasks: list[asyncio.Task] = []
        self._stopping = False

    # -- life cycle -------------------------------------------------------------------------
    async def start(self) -> Ready:
        self._dir = make_socket_dir()
        in_addr, out_addr = f"ipc://{self._dir}/in", f"ipc://{self._dir}/out"
        self.ctx = zmq.asyncio.Context()
        self.to_engine = self.ctx.socket(zmq.PUSH)
        self.to_engine.setsockopt(zmq.SNDHWM, 0)
        self.to_engine.setsockopt(zmq.LINGER, 0)
        self.to_engine.bind(in_addr)
        self.from_engine = self.ctx.socket(zmq.PULL)
        self.from_engine.setsockopt(zmq.RCVHWM, 0)
        self.from_engine.bind(out_addr)
        cmd = [sys.executable, "-m", "kvserve.engine.ipc.core_process", "--input", in_addr,
               "--output", out_addr, "--config", msgspec.json.encode(self.config).decode(),
               "--parent-pid", str(os.getpid()), "--log-level", self.log_level]  # fmt: skip
        self.proc = subprocess.Popen(cmd)
        self.ready = await self._wait_ready()
        self._tasks = [asyncio.create_task(self._receive()), asyncio.create_task(self._watch())]
        return self.ready

    async def _wait_ready(self) -> Ready:
        while True:
            if await self.from_engine.poll(100):
                msg = decode_output(await self.from_engine.recv())
                if isinstance(msg, Ready):
                    return msg
                if isinstance(msg, Fatal):
                    self._cleanup()
                    raise ModelLoadError(f"the engine failed to start: {msg.message}")
            elif self.proc.poll() is not None:
                self._cleanup()
                raise ModelLoadError(f"the engine process exited with code {self.proc.returncode}")

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        self._stopping = True
        if self.proc.poll() is None:
            # An engine that sent Fatal is exiting and reads nothing more: a send to it would
            # wait forever once its socket is gone (a PUSH with no peer blocks).
            with contextlib.suppress(zmq.ZMQError, TimeoutError):
                if self.dead is None:
                    await asyncio.wait_for(self.to_engine.send(encode(Shutdown())), 1.0)
            deadline = time.monotonic() + timeout_s
            while self.proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._cleanup()

    def _cleanup(self) -> None:
        self.to_engine.close(0)
        self.from_engine.close(0)
        self.ctx.term()
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- admission and requests -------------------------------------------------------------
    @property
    def num_admitted(self) -> int:
        return self.num_reserved + len(self.live)

    @property
    def num_waiting(self) -> int:
        """Requests waiting in the engine plus those sent but not yet seen by it."""
        return self.stats.num_waiting + self.num_sent_adds - self.num_engine_adds

    def num_queued_if_admitted(self, num_requests: int, max_running: int) -> int:
        """How many admitted requests would wait if ``num_requests`` more were admitted: all
        beyond the running ones while the engine has a queue, else all beyond its batch size."""
        running = self.stats.num_running if self.stats.num_waiting > 0 else max_running
        return self.num_admitted + num_requests - running

    def reserve(self, num_requests: int) -> None:
        self.num_reserved += num_requests

    def unreserve(self, num_requests: int) -> None:
        self.num_reserved -= num_requests
        assert self.num_reserved >= 0, "admission released more than it reserved"

    def add(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        queue: asyncio.Queue,
        remote: RemotePrefill | None = None,
    ) -> None:
        """Send a request, using one reservation; its outputs (or its failure) arrive on
        ``queue``, which several requests may share."""
        if self.dead is not None:
            raise EngineDeadError(self.dead)
        self.unreserve(1)
        self.live.add(request_id)
        self.queues[request_id] = queue
        self.num_sent_adds += 1
        self._send(AddRequest(request_id, prompt, params, remote))

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.queues.pop(rid, None)
            self.live.discard(rid)
        if self.dead is None and request_ids:
            self._send(AbortRequests(request_ids))

    def stop(self, request_id: str, stop: str) -> None:
        self.live.discard(request_id)
        if self.dead is None:
            self._send(StopRequest(request_id, stop))

    def _send(self, msg: AddRequest | AbortRequests | StopRequest) -> None:
        self.num_sent += 1
        self.to_engine.send(encode(msg))

    def admission_check(self) -> tuple[bool, str]:
        """(settled, problem): settled once the engine has handled every message sent; the
        problem is "" when admitted = running + waiting + in preparation then holds."""
        if self.num_engine_handled != self.num_sent:
            return False, ""
        s = self.stats
        in_engine = s.num_running + s.num_waiting
        if self.num_admitted == in_engine + self.num_reserved:
            return True, ""
        return True, (f"admitted {self.num_admitted} != running {s.num_running} + waiting "
                      f"{s.num_waiting} + in preparation {self.num_reserved}")  # fmt: skip

    # -- background tasks -------------------------------------------------------------------
    async def _receive(self) -> None:
        while True:
            msg = decode_output(await self.from_engine.recv())
            self.last_message = time.monotonic()
            if isinstance(msg, Fatal):
                self._mark_dead(f"the engine failed: {msg.message}")
                return
            if not isinstance(msg, OutputBatch):
                continue
            self.stats, self.num_engine_adds = msg.stats, msg.num_added
            self.num_engine_handled = msg.num_handled
            for out in msg.outputs:
                if out.finish_reason is not None:
                    self.live.discard(out.request_id)
                queue = self.queues.get(out.request_id)
                if queue is not None:
                    queue.put_nowait(out)
                    if out.finish_reason is not None:
                        del self.queues[out.request_id]
            for failed in msg.failed:
                self.live.discard(failed.request_id)
                queue = self.queues.pop(failed.request_id, None)
                if queue is not None:
                    queue.put_nowait(failed)
            if self.on_batch is not None:
                self.on_batch(msg)

    async def _watch(self) -> None:
        while self.proc.poll() is None:
            await asyncio.sleep(0.05)
        if not self._stopping:
            self._mark_dead(f"the engine process exited with code {self.proc.returncode}")

    def _mark_dead(self, why: str) -> None:
        if self.dead is not None:
            return
        self.dead = why
        log.error("%s", why)
        for queue in self.queues.values():
            queue.put_nowait(EngineDeadError(why))
        self.queues.clear()
        self.live.clear()
        if self.on_dead is not None:
            self.on_dead(why)

    def seconds_since_heard(self) -> float:
        return time.monotonic() - self.last_message

    @property
    def engine_pid(self) -> int | None:
        return self.proc.pid if getattr(self, "proc", None) else None
