"""A tensor-parallel worker process (ranks other than 0): join the group, build this rank's
shard of the model and KV pool, then run every step rank 0 broadcasts until told to stop."""

from __future__ import annotations

import logging
import os
import signal
import sys

import torch

from kvserve.config import EngineConfig, check_context_length
from kvserve.distributed.parallel_state import RankLayout
from kvserve.distributed.plan_channel import PlanChannel
from kvserve.distributed.process_group import destroy_tp_group, init_tp_group
from kvserve.engine.ipc.parent_watch import ParentGone, die_with_parent
from kvserve.engine.runner.device import resolve_device, resolve_dtype
from kvserve.engine.runner.model_runner import ModelRunner
from kvserve.engine.runner.tp_step import run_host_step
from kvserve.loader import open_model_source

log = logging.getLogger("kvserve.distributed")


def rank_device(setting: str, layout: RankLayout, rank: int) -> torch.device:
    """CPU for every rank on CPU; on CUDA, GPU ``rank % ranks-per-host`` of the rank's host."""
    base = resolve_device(setting)
    if base.type != "cuda":
        return base
    return torch.device("cuda", layout.local_index(rank))


def worker_main(config: EngineConfig, rank: int, init_addr: str, parent_pid: int) -> None:
    logging.basicConfig(
        level=logging.INFO, format=f"%(levelname)s tp-rank{rank}: %(message)s", force=True
    )
    try:
        die_with_parent(parent_pid)
        # Nobody drains a worker: SIGTERM (also the parent-death signal) ends it at once.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        run_worker(config, rank, init_addr)
    except ParentGone:
        os._exit(3)
    except Exception as exc:  # one line for the operator; rank 0 reports the engine failure
        log.error("rank %d failed: %s: %s", rank, type(exc).__name__, exc)
        sys.stderr.flush()
        os._exit(1)


def run_worker(config: EngineConfig, rank: int, init_addr: str) -> None:
    layout = RankLayout(config.tp, config.nnodes, config.node_rank)
    device = rank_device(config.device, layout, rank)
    tp = init_tp_group(config.tp, rank, init_addr, device)
    source = open_model_source(config.model, config.load_format)
    max_len = check_context_length(config.context_length, source.config)
    weights = None if config.load_format == "dummy" else source.weights()
    dtype = resolve_dtype(config.dtype, device)
    runner = ModelRunner(config, source.config, weights, device, dtype, max_len, tp)
    serve_steps(runner, PlanChannel(tp))
    runner.release_graphs()
    destroy_tp_group(tp)


@torch.inference_mode()
def serve_steps(runner: ModelRunner, channel: PlanChannel) -> None:
    """Run each broadcast step; a step's sampled ids feed the next one's pending rows."""
    prev: torch.Tensor | None = None
    while (msg := channel.recv()) is not None:
        out = run_host_step(runner, msg.host, msg.pending_src, prev, msg.rows.rows())
        prev = None if out is None else out.token_ids
