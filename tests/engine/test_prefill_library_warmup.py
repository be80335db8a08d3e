"""What the engine builds cuDNN's prefill graphs for at start (``warmup.library_step``,
``GraphDims``) and how a step is padded to a graph (``pad_step_inputs``): plain functions of the
scheduler's limits and of a step's metadata, so they run on CPU; the graphs themselves are built
and timed on the H200 (``tests/gpu/test_cudnn_prefill.py``)."""

from __future__ import annotations

import pytest
import torch

from kvserve.config import SchedulerConfig
from kvserve.engine.runner.warmup import library_step, step_meta
from kvserve.layers.attention.cudnn_prefill import MIN_PAIRS, GraphDims, pad_step_inputs


@pytest.mark.parametrize(
    ("max_chunk", "budget", "context", "max_chunks", "want"),
    [
        (8192, 8192, 131072, 256, (1, 8192, 0)),  # the defaults: one whole chunk
        (2048, 8192, 131072, 256, (1, 2048, 0)),  # 2048 x 2048 pairs: just enough
        (1024, 8192, 131072, 256, (1, 1024, 3072)),  # a short chunk behind a cached prefix
        (8192, 8192, 1024, 256, (4, 1024, 0)),  # short context: several sequences
        (8192, 8192, 1024, 2, None),  # ... more than may run at once
        (8192, 512, 256, 256, None),  # ... or than the step's budget holds
    ],
)
def test_the_warm_up_step_reaches_the_library_within_the_engine_limits(
    max_chunk: int, budget: int, context: int, max_chunks: int, want: tuple | None
) -> None:
    got = library_step(max_chunk, budget, context, max_chunks, MIN_PAIRS)
    assert got == want
    if got is not None:
        chunks, rows, prefix = got
        assert chunks * rows * (prefix + rows) >= MIN_PAIRS
        assert rows <= max_chunk and chunks * rows <= budget and prefix + rows <= context


def test_graph_dims_round_the_engine_limits_up_to_powers_of_two() -> None:
    def dims(chunk: int, budget: int, running: int, pages: int) -> GraphDims:
        config = SchedulerConfig(max_running_requests=running, max_num_batched_tokens=budget,
                                 chunked_prefill_size=chunk)  # fmt: skip
        return GraphDims.for_engine(config, pages)

    assert dims(8192, 8192, 256, 8192) == GraphDims(8192, 8192, 256)  # the defaults, 128K
    assert dims(3000, 8192, 5, 100) == GraphDims(4096, 128, 8)
    assert dims(8192, 2000, 256, 1) == GraphDims(2048, 1, 256)  # chunks within the budget
    assert dims(10, 16, 1, 1) == GraphDims(64, 1, 1)  # the smallest chunk bucket


def test_a_step_is_padded_to_the_fixed_dims_or_to_its_own_when_larger() -> None:
    meta = step_meta(2, 100, 7, torch.device("cpu"), prefix=5, prefills=3)
    # rows 100 and tables 7 wide: within the graph's 512 rows and 16 columns
    inputs = pad_step_inputs(meta, 2, batch=4, max_query=512, width=16)
    assert (inputs.shape_batch, inputs.max_query, inputs.table.shape[2]) == (4, 512, 16)
    assert inputs.seq_q.flatten().tolist() == [100, 100, 100, 0]  # padded sequence: empty
    assert inputs.seq_kv.flatten().tolist() == [105, 105, 105, 0]
    assert inputs.q_start.flatten().tolist() == [0, 100, 200, 300, 300]
    assert inputs.table[:3, 0, 7:].eq(0).all()
    # dims smaller than the step (0, or too small): the step's own powers of two
    for dims in ({}, {"max_query": 64, "width": 4}):
        inputs = pad_step_inputs(meta, 2, batch=4, **dims)
        assert (inputs.max_query, inputs.table.shape[2]) == (128, 8)
