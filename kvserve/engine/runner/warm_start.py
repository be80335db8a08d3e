"""The start's passes over every step a request can cause, so that none pays a compile: the
decode CUDA graphs, the eager warm-up and the prefill library's graphs. With
``KVSERVE_COMPILE_WORKERS`` above 0 (the default, ``auto``, is half the CPUs), the Triton
kernels those passes launch are first recorded by a run of them that launches none and compiled
by worker processes (``kernels.compile_ahead``); the passes then load them from Triton's disk
cache."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from kvserve.config import SchedulerConfig
from kvserve.engine.runner.cuda_graphs import DecodeGraphs
from kvserve.engine.runner.kv_pool import KVPool
from kvserve.engine.runner.start_manifest import StartManifest
from kvserve.engine.runner.warmup import run_library_step, warm_up_eager, warm_up_prefill_library
from kvserve.kernels.compile_ahead import (
    AheadReport,
    CompilerPool,
    KernelSpec,
    compile_workers_setting,
    counting_compiles,
    gpu_target,
    recording_compiles,
)
from kvserve.kernels.kernel_hashes import settle_kernel_hashes
from kvserve.layers.attention import AttentionBackend
from kvserve.layers.attention.cudnn_prefill import CudnnPrefill

log = logging.getLogger("kvserve.warm_start")


@dataclass(frozen=True)
class StartPasses:
    model: torch.nn.Module
    kv: KVPool
    backend: AttentionBackend
    prefill: CudnnPrefill | None  # the prefill library, when the engine has one
    context_length: int
    scheduler: SchedulerConfig
    graph_max_bs: int  # 0: no decode graphs
    max_pages: int
    hidden_size: int
    dtype: torch.dtype
    device: torch.device
    compilers: CompilerPool | None  # compile ahead on these (``start_compilers``), or not

    def run(self, record: bool) -> DecodeGraphs | None:
        """The passes: the decode graphs captured (``record``: each size's forward pass alone),
        the eager warm-up, and the prefill library's graphs built (``record``: its step alone,
        whose Triton kernels are what the recording wants)."""
        graphs = None
        if self.graph_max_bs:
            graphs = DecodeGraphs(
                self.model, self.kv, self.backend, self.graph_max_bs, self.max_pages,
                self.hidden_size, self.dtype, self.device, capture=not record,
            )  # fmt: skip
        warm_up_eager(
            self.model, self.kv, self.backend, self.device, self.context_length,
            self.scheduler.running_ceiling,
        )  # fmt: skip
        if self.prefill is not None and record:
            run_library_step(self.model, self.kv, self.backend, self.context_length,
                             self.scheduler)  # fmt: skip
        elif self.prefill is not None:
            warm_up_prefill_library(
                self.model, self.kv, self.backend, self.prefill, self.context_length,
                self.scheduler,
            )  # fmt: skip
        return graphs


@dataclass(frozen=True)
class StartReport:
    ahead: AheadReport | None  # None: compile ahead off
    late_compiles: list[str]  # kernels Triton compiled at their launch in the passes
    cached: int  # kernels the passes loaded from Triton's disk cache
    seconds: float
    recorded: bool = False  # compile ahead's kernel list came from a recording pass, not a
    # start manifest (``start_manifest``)


def start_compilers(ranks: int) -> CompilerPool | None:
    """The compile workers of a start on the GPU, started before the model is built (they
    import torch and Triton meanwhile), ``auto`` sharing the CPUs among the ``ranks`` engines
    of a tensor-parallel group; None when ``KVSERVE_COMPILE_WORKERS`` is 0. Settles the
    kernels' hashes either way."""
    # Before the first compile (the KV pool's sizing pass compiles too), with compile ahead on
    # or off: the kernels' disk-cache names then do not depend on the setting (unsettled, a
    # start with it off compiled 2 of 15 kernels that one with it on had cached: H200, s52).
    settle_kernel_hashes()
    workers = compile_workers_setting(ranks)
    return CompilerPool(workers) if workers else None


def warm_start(passes: StartPasses) -> tuple[DecodeGraphs | None, StartReport]:
    """Runs the start's passes (their kernels compiled ahead first, unless that is off):
    the captured decode graphs, and what the start compiled where."""
    start = time.perf_counter()
    ahead, kept, specs, recorded = None, None, [], False
    if passes.compilers is not None:
        kept = _start_manifest(passes)
        ahead, specs, recorded = _compile_ahead(passes, passes.compilers, kept)
    with counting_compiles() as count:
        graphs = passes.run(record=False)
    if kept is not None and ahead is not None:
        if count.compiled or ahead.failed:  # the list was short, or a kernel of it failed
            kept.forget()  # the next start records again
        elif recorded:
            kept.save(specs)
    seconds = time.perf_counter() - start
    report = StartReport(ahead, count.compiled, count.cached, seconds, recorded)
    late = f": {', '.join(sorted(set(count.compiled)))}" if count.compiled else ""
    log.info(
        "start passes took %.1f s; Triton compiled %d kernels at their launch%s (%d from its "
        "disk cache)", report.seconds, len(count.compiled), late, count.cached,
    )  # fmt: skip
    return graphs, report


def _start_manifest(passes: StartPasses) -> StartManifest | None:
    try:
        return StartManifest.of(passes, gpu_target())
    except Exception as exc:  # noqa: BLE001 - the start records its kernels instead
        log.warning("no start manifest: %s", f"{type(exc).__name__}: {exc}".splitlines()[0])
        return None


def _compile_ahead(
    passes: StartPasses, compilers: CompilerPool, kept: StartManifest | None
) -> tuple[AheadReport, list[KernelSpec], bool]:
    """Compiles the kernels the passes would compile: those a start of the same signature kept
    (``kept``), else those a run of the passes records (launching none). Also returns the list
    and whether it was recorded."""
    t = time.perf_counter()
    specs = None if kept is None else kept.load()
    recorded = specs is None
    if specs is None:
        with recording_compiles() as specs:
            passes.run(record=True)
            if passes.device.type == "cuda":
                torch.cuda.synchronize(passes.device)
    listed = time.perf_counter() - t
    report = compilers.compile(specs)
    for line in report.failed:
        log.warning("compile ahead: %s (compiled at its launch instead)", line)
    longest = max(report.compile_s.items(), key=lambda kv: kv[1], default=("none", 0.0))
    log.info(
        "compiled %d Triton kernels ahead in %.1f s on %d processes (%.1f s of compiles, the "
        "longest %s in %.1f s; %d of the %d %s in %.1f s were in the disk cache)",
        len(report.compile_s), report.seconds, report.workers, sum(report.compile_s.values()),
        *longest, report.cached, report.kernels,
        "recorded" if recorded else "listed by the start manifest, read", listed,
    )  # fmt: skip
    return report, specs, recorded
