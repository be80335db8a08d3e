"""The worker processes of the ranks on this host: started with ``spawn`` (daemons that also
die with their parent: the parent-death signal), watched for liveness by the process that
started them, stopped by it."""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess

from kvserve.config import EngineConfig

log = logging.getLogger("kvserve.distributed")


class RankFailed(RuntimeError):
    """A tensor-parallel rank exited or stopped answering: the engine cannot go on."""


class TPWorkers:
    def __init__(self, procs: dict[int, BaseProcess]) -> None:
        self.procs = procs

    @classmethod
    def start(cls, config: EngineConfig, ranks: range | list[int], init_addr: str) -> TPWorkers:
        from kvserve.distributed.worker import worker_main

        ctx = mp.get_context("spawn")
        procs: dict[int, BaseProcess] = {}
        parent = mp.current_process().pid or 0
        for rank in ranks:
            p = ctx.Process(
                target=worker_main, args=(config, rank, init_addr, parent),
                name=f"kvserve-tp-rank{rank}", daemon=True,
            )  # fmt: skip
            p.start()
            procs[rank] = p
        return cls(procs)

    def check(self, cause: BaseException | None = None, grace_s: float = 0.0) -> None:
        """Raise ``RankFailed`` if a worker has exited. ``grace_s``: how long to wait for one
        to exit (a collective that failed may have seen a peer go before it is reaped)."""
        if grace_s and self.procs:
            wait([p.sentinel for p in self.procs.values()], timeout=grace_s)
        for rank, p in self.procs.items():
            if not p.is_alive():
                raise RankFailed(
                    f"tensor-parallel rank {rank} (pid {p.pid}) exited with code {p.exitcode}; "
                    "the engine cannot continue"
                ) from cause

    def wait_any(self) -> int:
        """Block until a worker exits; returns its exit code (for a node with no scheduler)."""
        done = wait([p.sentinel for p in self.procs.values()])
        for p in self.procs.values():
            if p.sentinel in done:
                p.join()
                return p.exitcode or 0
        return 0

    def stop(self, timeout_s: float = 10.0) -> None:
        """Wait for the workers to leave (after the stop message), then kill what is left."""
        deadline = time.monotonic() + timeout_s
        for p in self.procs.values():
            p.join(max(0.0, deadline - time.monotonic()))
        for rank, p in self.procs.items():
            if p.is_alive():
                log.warning("killing tensor-parallel rank %d (pid %d)", rank, p.pid)
                p.kill()
                p.join(5)
        self.procs = {}
