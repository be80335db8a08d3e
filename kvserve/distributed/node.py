"""A host other than node 0 (``kvserve serve --node-rank N``): no scheduler and no API, only
this host's ranks, which take their steps from rank 0 over the network. It exits when they do:
0 after rank 0 stopped them, 1 when one failed (rank 0's engine fails too)."""

from __future__ import annotations

import logging

from kvserve.config import EngineConfig
from kvserve.distributed.parallel_state import RankLayout
from kvserve.distributed.rank0 import check_splits
from kvserve.distributed.workers import TPWorkers
from kvserve.loader import open_model_source

log = logging.getLogger("kvserve.distributed")


def run_worker_node(config: EngineConfig) -> int:
    check_splits(open_model_source(config.model, config.load_format).config, config.tp)
    layout = RankLayout(config.tp, config.nnodes, config.node_rank)
    assert config.dist_init_addr is not None  # the config requires it with nnodes > 1
    workers = TPWorkers.start(config, layout.local_ranks, config.dist_init_addr)
    log.info(
        "node %d of %d: ranks %s, rendezvous at %s", config.node_rank, config.nnodes,
        list(layout.local_ranks), config.dist_init_addr,
    )  # fmt: skip
    code = workers.wait_any()
    workers.stop(10.0 if code == 0 else 0.0)
    log.info("node %d: ranks finished (exit code %d)", config.node_rank, code)
    return 0 if code == 0 else 1
