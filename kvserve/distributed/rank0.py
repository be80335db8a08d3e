"""Rank 0's side of tensor parallelism: check the model splits, start this host's other
ranks, join the group; later watch the workers and stop them."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from kvserve.config import EngineConfig, ModelConfig
from kvserve.distributed.parallel_state import RankLayout, TPGroup
from kvserve.distributed.process_group import (
    abort_tp_group,
    destroy_tp_group,
    free_local_addr,
    init_tp_group,
)
from kvserve.distributed.workers import TPWorkers
from kvserve.errors import ConfigError

if TYPE_CHECKING:
    from kvserve.engine.runner.model_runner import ModelRunner

log = logging.getLogger("kvserve.distributed")


def check_splits(mc: ModelConfig, tp: int) -> None:
    """Refuse, before any process starts, a model whose heads or MLP do not split ``tp`` ways."""
    if mc.num_heads % tp:
        raise ConfigError(f"--tp {tp}: the model's {mc.num_heads} attention heads do not split")
    if mc.num_kv_heads % tp and tp % mc.num_kv_heads:
        raise ConfigError(
            f"--tp {tp}: the model's {mc.num_kv_heads} KV heads neither split nor replicate evenly"
        )
    if mc.intermediate_size % tp:
        raise ConfigError(
            f"--tp {tp}: the MLP's {mc.intermediate_size} intermediate features do not split"
        )
    moe = mc.moe
    if moe is not None and (
        moe.expert_intermediate_size % tp or moe.shared_expert_intermediate_size % tp
    ):
        raise ConfigError(f"--tp {tp}: the experts' intermediate features do not split")


class Rank0:
    """The engine-core process as rank 0: owns the worker processes of its host."""

    def __init__(self, config: EngineConfig, mc: ModelConfig, device: torch.device) -> None:
        check_splits(mc, config.tp)
        layout = RankLayout(config.tp, config.nnodes, config.node_rank)
        if device.type == "cuda" and torch.cuda.device_count() < layout.per_node:
            raise ConfigError(
                f"--tp {config.tp} over {config.nnodes} host(s) needs {layout.per_node} GPUs "
                f"here; {torch.cuda.device_count()} are visible"
            )
        addr = config.dist_init_addr or free_local_addr()
        self.workers = TPWorkers.start(config, list(layout.local_ranks)[1:], addr)
        try:
            self.tp: TPGroup = init_tp_group(config.tp, 0, addr, device)
        except BaseException:
            self.workers.stop(0)
            raise

    def check(self, cause: BaseException | None = None) -> None:
        self.workers.check(cause, grace_s=1.0 if cause is not None else 0.0)

    def close(self, runner: ModelRunner | None) -> None:
        """Tell the workers to stop, leave the group with them, then reap them. NCCL's teardown
        waits for every rank and for every CUDA graph that captured the communicator, so the
        graphs go first and rank 0 leaves while the workers leave, not after they exit. With a
        rank dead (or no runner yet to send the stop message) the group is aborted instead."""
        alive = runner is not None and all(p.is_alive() for p in self.workers.procs.values())
        if runner is not None and alive:
            runner.release_graphs()
            try:
                runner.send_stop()
            except RuntimeError as exc:
                log.warning("stop message not delivered: %s", exc)
                alive = False
        if alive:
            destroy_tp_group(self.tp)
            self.workers.stop(10.0)
        else:
            self.workers.stop(0.0)
            abort_tp_group(self.tp)
