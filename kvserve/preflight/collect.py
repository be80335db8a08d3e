"""Run every probe that applies and gather the node's facts in one place."""

from __future__ import annotations

from pathlib import Path

from kvserve.preflight.facts import (
    FabricManagerFacts,
    KernelLogFacts,
    NcclFacts,
    NodeFacts,
    TorchCudaFacts,
)
from kvserve.preflight.options import PreflightOptions
from kvserve.preflight.probes.commands import Runner, run_command
from kvserve.preflight.probes.fabric_manager import probe_fabric_manager
from kvserve.preflight.probes.gpu import probe_gpus
from kvserve.preflight.probes.host import probe_host
from kvserve.preflight.probes.kernel_log import probe_kernel_log
from kvserve.preflight.probes.kmods import probe_modules
from kvserve.preflight.probes.model_files import probe_model
from kvserve.preflight.probes.nccl import probe_nccl
from kvserve.preflight.probes.settings import probe_settings
from kvserve.preflight.probes.sysfs_ib import probe_ib
from kvserve.preflight.probes.torch_cuda import probe_torch


def collect(opts: PreflightOptions, run: Runner = run_command, root: Path = Path("/")) -> NodeFacts:
    gpu = probe_gpus(run, root)
    no_gpu = gpu.unavailable_reason
    if gpu.available:
        torch, log, fm = probe_torch(), probe_kernel_log(run), probe_fabric_manager(run)
    else:
        torch = TorchCudaFacts(None, reason=no_gpu)
        log = KernelLogFacts(False, no_gpu)
        fm = FabricManagerFacts(False, reason=no_gpu)
    if not opts.nccl:
        nccl = NcclFacts(ran=False, reason="not run: add --nccl")
    elif not gpu.available:
        nccl = NcclFacts(ran=False, reason=no_gpu)
    else:
        nccl = probe_nccl()
    return NodeFacts(
        gpu=gpu,
        kernel_log=log,
        fabric_manager=fm,
        torch=torch,
        modules=probe_modules(root),
        ib=probe_ib(root, run),
        nccl=nccl,
        host=probe_host(root, opts.model),
        model=probe_model(opts.model) if opts.model else None,
        settings=probe_settings(),
    )
