"""Compiling a start's Triton kernels side by side, before its warm-up launches them.

Triton compiles a kernel at its first launch, one after another in the launching process. With
an empty Triton cache that was most of an 8B engine's start on the H200 (ready in 24 s with a
bf16 KV cache, 43 s with FP8, s50). So the start's passes first run with Triton's compile hook
recording each kernel Triton would compile and skipping it (``recording_compiles``: nothing is
compiled and nothing launched; the outputs stay as allocated, and the start reads none of them),
then worker processes (``compile_worker``) compile the recorded kernels into Triton's disk cache,
where the start's real passes find them. A kernel that a worker could not compile compiles at
its launch, as before; ``counting_compiles`` counts those. With 8 workers and an empty cache an
8B engine (128K context) was ready in 16.3 s against 36.8 s with an FP8 KV cache (26 kernels,
33 s of compiles summed), 10.0 against 14.5 s with bf16 (H200, one machine, s52). Kernels
already in the disk cache go to no worker (``in_disk_cache``), so a warm start paid only the
recording pass (1.8 s on that machine, 3.8 s on another), which a start of an engine that
started before skips (``engine.runner.start_manifest``).

Processes, not threads: Triton's front end is Python and holds the GIL (six matmul kernels on
two threads took 0.72x of their serial time, not 0.5x). On by default (``auto``);
``KVSERVE_COMPILE_WORKERS=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from queue import Empty, SimpleQueue

from kvserve.errors import ConfigError
from kvserve.kernels.kernel_hashes import kvserve_kernels

log = logging.getLogger("kvserve.compile_ahead")

COMPILE_WORKERS_ENV = "KVSERVE_COMPILE_WORKERS"
_MOST_WORKERS = 16
_JOB_TIMEOUT_S = 600.0  # one kernel's compile; the longest seen on the H200 took 3.7 s


@functools.cache
def compile_workers_setting(ranks: int = 1) -> int:
    """``KVSERVE_COMPILE_WORKERS``: processes that compile a start's Triton kernels ahead of its
    warm-up, for each of the ``ranks`` engines starting together on the host (tensor
    parallelism); 0 compiles each at its first launch. ``auto`` (the default): half the CPUs
    this process may run on, shared by the ranks, at most 16 a rank."""
    value = os.environ.get(COMPILE_WORKERS_ENV, "auto")
    if value == "auto":
        return min(_MOST_WORKERS, max(1, usable_cpus() // 2 // ranks))
    if not value.isdigit():
        raise ConfigError(f"{COMPILE_WORKERS_ENV}={value!r}: expected auto or a whole number")
    return int(value)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask: a container's cpuset), else all."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 2


@dataclass(frozen=True)
class KernelSpec:
    """One compile Triton was asked for: the kernel's module and name, and Triton's JSON of the
    specialization (signature, constexprs, attributes, options)."""

    module: str
    name: str
    specialization: str


@contextlib.contextmanager
def recording_compiles() -> Iterator[list[KernelSpec]]:
    """Within: no kvserve kernel launches; each one a launch asks for is recorded (once) instead
    of compiled. A kernel this process already compiled is hidden for the while (its in-memory
    cache swapped for an empty one), or it would launch on what the skipped kernels before it
    left unwritten (an MoE step's expert ids, say: with the recording before this, GPU engine
    tests of quantized and MoE models hit an illegal address); it is not recorded, as the real
    passes find it in memory. The list fills when the block ends."""
    from triton import knobs

    recorded: list[KernelSpec] = []
    specs: dict[tuple[str, str, str], KernelSpec] = {}
    kernels = kvserve_kernels()
    compiled = {id(kernel): kernel.device_caches for kernel in kernels}  # hidden meanwhile

    def record(*, key: str, fn: object, compile: dict, **_: object) -> bool:
        module, name = fn.module, fn.name  # type: ignore[attr-defined] - JitFunctionInfo
        caches = compiled.get(id(fn.jit_function), {})  # type: ignore[attr-defined]
        device_cache = caches.get(compile["device"])
        if device_cache is None or device_cache[0].get(key) is None:  # not compiled here yet
            spec = KernelSpec(module, name, compile["specialization_data"])
            specs.setdefault((module, name, key), spec)
        return True  # Triton then neither compiles nor launches

    for kernel in kernels:
        kernel.device_caches = defaultdict(kernel.create_binder)
    previous, knobs.runtime.jit_cache_hook = knobs.runtime.jit_cache_hook, record
    try:
        yield recorded
    finally:
        knobs.runtime.jit_cache_hook = previous
        for kernel in kernels:
            kernel.device_caches = compiled[id(kernel)]
        recorded.extend(specs.values())


@dataclass
class CompileCount:
    """Kernels Triton compiled (cache misses) and found in its disk cache, while counting."""

    compiled: list[str] = field(default_factory=list)
    cached: int = 0


@contextlib.contextmanager
def counting_compiles() -> Iterator[CompileCount]:
    """Within: every kernel Triton compiles or loads from its disk cache is counted."""
    from triton import knobs

    count = CompileCount()

    def listen(*, src: object, cache_hit: bool, **_: object) -> None:
        if cache_hit:
            count.cached += 1
        else:
            count.compiled.append(getattr(getattr(src, "fn", None), "__name__", str(src)))

    previous, knobs.compilation.listener = knobs.compilation.listener, listen
    try:
        yield count
    finally:
        knobs.compilation.listener = previous


@dataclass(frozen=True)
class AheadReport:
    kernels: int  # recorded
    cached: int  # of those, already in Triton's disk cache: not sent to the workers
    failed: list[str]  # one line each
    workers: int
    seconds: float
    compile_s: dict[str, float]  # each kernel compiled: seconds in its worker, by "name #i"


def gpu_target() -> list[object]:
    """The active GPU's Triton target: backend, arch, warp size."""
    from triton.runtime.driver import driver

    target = driver.active.get_current_target()
    return [target.backend, target.arch, target.warp_size]


def _drive(
    worker: subprocess.Popen,
    jobs: SimpleQueue,
    failed: list[str],
    seconds: dict[str, float],
    job_timeout_s: float,
) -> None:
    """Feeds one worker a job at a time until none is left, then ends it. A worker
    that does not answer within ``job_timeout_s`` is killed (the start must not hang on it)."""
    assert worker.stdin is not None and worker.stdout is not None
    try:
        while True:
            try:
                job = jobs.get_nowait()
            except Empty:
                break
            try:
                worker.stdin.write(json.dumps(job) + "\n")
                worker.stdin.flush()
                # one line answers each job, so nothing waits in the reader's buffer here
                if not select.select([worker.stdout], [], [], job_timeout_s)[0]:
                    worker.kill()
                    failed.append(f"{job['module']}.{job['name']}: no answer in {job_timeout_s} s")
                    break
                answer = worker.stdout.readline()
            except OSError:  # its pipe broke: it exited
                answer = ""
            if not answer:
                failed.append(f"{job['module']}.{job['name']}: the worker exited")
                break
            try:
                reply = json.loads(answer)
            except json.JSONDecodeError:  # its answers are out of step: use it no more
                failed.append(f"{job['module']}.{job['name']}: the worker answered {answer!r}")
                break
            if reply["error"] is None:
                seconds[job["label"]] = reply["seconds"]
            else:
                failed.append(reply["error"])
    finally:
        _close(worker)


def _close(worker: subprocess.Popen) -> None:
    """Ends a worker that has answered every job it was sent (its kernels are in the disk
    cache by then): killed, not waited for, as one given no job may still be importing torch."""
    if worker.stdin is not None and not worker.stdin.closed:
        with contextlib.suppress(OSError):  # a worker that exited early
            worker.stdin.close()
    worker.kill()
    worker.wait()


class CompilerPool:
    """``workers`` compile worker processes, started at once (each imports torch and Triton
    while the start builds the model), then given one list of kernels to compile."""

    def __init__(self, workers: int) -> None:
        command = [sys.executable, "-m", "kvserve.kernels.compile_worker"]
        self.workers = [
            subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for _ in range(workers)
        ]
        for worker in self.workers:
            _lower_priority(worker.pid)
        # an engine that fails before its warm-up still ends its workers
        weakref.finalize(self, _close_all, list(self.workers))

    def compile(
        self, specs: list[KernelSpec], job_timeout_s: float = _JOB_TIMEOUT_S
    ) -> AheadReport:
        """Compiles those of ``specs`` not yet in Triton's disk cache, each worker taking the
        next kernel when it is done with one (long compiles do not queue behind each other);
        then the workers end."""
        start = time.perf_counter()
        target = gpu_target() if specs else []
        missing = [spec for spec in specs if not _in_disk_cache(spec, target)]
        jobs: SimpleQueue = SimpleQueue()
        for i, spec in enumerate(missing):
            jobs.put({"module": spec.module, "name": spec.name, "label": f"{spec.name} #{i}",
                      "specialization": spec.specialization, "target": target})  # fmt: skip
        failed: list[str] = []
        seconds: dict[str, float] = {}
        drivers = [
            threading.Thread(target=_drive, args=(worker, jobs, failed, seconds, job_timeout_s))
            for worker in self.workers
        ]
        for thread in drivers:
            thread.start()
        for thread in drivers:
            thread.join()
        elapsed = time.perf_counter() - start
        return AheadReport(
            len(specs), len(specs) - len(missing), failed, len(self.workers), elapsed, seconds
        )


# Workers importing torch while the engine builds its model took CPU from it: a warm start
# (every kernel cached) was ready in 5.2-5.9 s with them against 4.7 s without (H200, s53)
WORKER_NICENESS = 10  # above the engine's own
MAX_NICENESS = 19


def _lower_priority(pid: int) -> None:
    with contextlib.suppress(OSError):  # the process is gone
        own = os.getpriority(os.PRIO_PROCESS, 0)
        os.setpriority(os.PRIO_PROCESS, pid, min(MAX_NICENESS, own + WORKER_NICENESS))


def _in_disk_cache(spec: KernelSpec, target: list[object]) -> bool:
    """A warm cache's kernels need no worker (with every kernel cached, a warm 8B start spent
    1.4-3.2 s waiting on workers that only found them there: H200, s52)."""
    from kvserve.kernels.compile_worker import in_disk_cache

    try:
        return in_disk_cache(spec.module, spec.name, spec.specialization, target)
    except Exception:  # noqa: BLE001 - Triton's internals moved, or a bad spec: let a worker try
        return False


def _close_all(workers: list[subprocess.Popen]) -> None:
    for worker in workers:
        _close(worker)
