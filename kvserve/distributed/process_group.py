"""Joining and leaving the tensor-parallel process group.

NCCL on CUDA, gloo on CPU; the rendezvous is torch.distributed's TCP store at ``init_addr``
(``host:port``, hosted by rank 0). NVLink multicast (NVLS) stays off: on a shared host it can
take every GPU out of service, so both switches are set before NCCL starts."""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from kvserve.distributed.parallel_state import TPGroup
from kvserve.errors import ConfigError

log = logging.getLogger("kvserve.distributed")

# A collective that waits longer than this means a peer hung or died: fail instead of waiting.
TIMEOUT_ENV = "KVSERVE_DIST_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 300.0
# Workers wait for the next plan while the engine idles, for as long as it idles.
PLAN_TIMEOUT = timedelta(days=30)
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def collective_timeout_s() -> float:
    """``KVSERVE_DIST_TIMEOUT_S``: seconds above 0 (default 300); anything else is refused."""
    value = os.environ.get(TIMEOUT_ENV, "")
    if not value:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise ConfigError(f"{TIMEOUT_ENV}={value!r}: expected a number of seconds above 0")
    return seconds


def free_local_addr() -> str:
    """``127.0.0.1:<free port>`` for a one-host group."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def init_tp_group(size: int, rank: int, init_addr: str, device: torch.device) -> TPGroup:
    """Join the group as ``rank`` of ``size``; returns once every rank has joined."""
    os.environ.update(MULTICAST_OFF)
    if not dist.is_available():
        raise ConfigError("tensor parallelism needs torch.distributed, which this torch lacks")
    if dist.is_initialized():
        raise ConfigError("a tensor-parallel group is already running in this process")
    cuda = device.type == "cuda"
    if cuda:  # kernels (Triton's among them) launch on the current device
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=collective_timeout_s())
    dist.init_process_group(
        "nccl" if cuda else "gloo", init_method=f"tcp://{init_addr}", rank=rank,
        world_size=size, timeout=timeout, device_id=device if cuda else None,
    )  # fmt: skip
    cpu_group = dist.new_group(backend="gloo", timeout=PLAN_TIMEOUT)
    log.info("rank %d of %d joined (%s, %s)", rank, size, dist.get_backend(), device)
    return TPGroup(rank, size, dist.group.WORLD, cpu_group)


def destroy_tp_group(tp: TPGroup) -> None:
    """Leave the group; with NCCL every rank must call this together."""
    if tp.is_parallel and dist.is_initialized():
        dist.destroy_process_group()


def abort_tp_group(tp: TPGroup) -> None:
    """Leave a group whose peers are gone: NCCL's orderly teardown would wait for them forever,
    so its communicators are aborted; gloo's teardown needs no peer."""
    if not (tp.is_parallel and dist.is_initialized()):
        return
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if dist.get_backend() == "nccl" and abort is not None:
        abort()
    else:
        dist.destroy_process_group()
