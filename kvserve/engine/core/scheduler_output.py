"""The batch plan the scheduler hands the runner: bookkeeping only, no tensors."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvserve.engine.core.request import Request


@dataclass
class ScheduledChunk:
    request: Request
    start: int  # first position computed this step (== request.num_computed_tokens at plan time)
    num_new_tokens: int  # positions [start, start + num_new_tokens) are computed this step
    sample: bool  # the chunk reaches the last known token, so a next token is sampled


@dataclass
class SchedulerOutput:
    # Batch order = row order, single-token chunks (decodes) first, so attention backends can
    # send them through a decode kernel.
    chunks: list[ScheduledChunk] = field(default_factory=list)
    num_batched_tokens: int = 0  # sum of num_new_tokens
    preempted: list[Request] = field(default_factory=list)  # sent back to waiting this step

    @property
    def is_empty(self) -> bool:
        return not self.chunks
