"""A step under tensor parallelism. Rank 0 turns the plan into host arrays once, broadcasts
them with each sampled row's sampling inputs (a plain message, no request objects) and runs
the step like every other rank: the same forward, full logits on every rank (the LM head
all-gathers them) and the same sampling (seeded per request), so each rank also holds the
sampled ids the next step's pending rows need (overlap scheduling) without another broadcast."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from kvserve.engine.core.request import Request
from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.engine.core.scheduler_output import SchedulerOutput
from kvserve.engine.runner.input_batch import (
    HostInputs,
    build_host_inputs,
    device_inputs,
    fill_pending_rows,
)
from kvserve.engine.runner.launched_step import LaunchedStep
from kvserve.layers.sampler import SamplerOutput

if TYPE_CHECKING:
    from kvserve.engine.runner.model_runner import ModelRunner


# What the sampler reads of a request's sampling parameters.
_SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "logprobs",
                    "repetition_penalty", "presence_penalty", "frequency_penalty")  # fmt: skip


@dataclass
class SampleRow:
    """What ``build_sampling_batch`` reads of a request, copied at launch."""

    params: SamplingParams
    seed: int
    num_output_tokens: int
    num_pending: int
    output_token_ids: list[int] = field(default_factory=list)  # only with penalties
    prompt_token_ids: list[int] = field(default_factory=list)  # only with a repetition penalty


@dataclass
class SampleRows:
    """The sampled rows as columns, each distinct sampling setting once (a batch has few):
    cheap to pickle, where 256 parameter objects were not."""

    settings: list[tuple]  # distinct values of _SAMPLING_FIELDS
    setting: list[int]  # per row: index into settings
    seeds: list[int]
    num_output_tokens: list[int]
    num_pending: list[int]
    output_ids: dict[int, list[int]]  # row -> its output ids (rows with penalties only)
    prompt_ids: dict[int, list[int]]  # row -> its prompt ids (a repetition penalty only)

    @classmethod
    def of(cls, requests: list[Request]) -> SampleRows:
        index: dict[tuple, int] = {}
        rows = cls([], [], [], [], [], {}, {})
        for i, r in enumerate(requests):
            p = r.params
            key = (p.temperature, p.top_k, p.top_p, p.min_p, p.logprobs,
                   p.repetition_penalty, p.presence_penalty, p.frequency_penalty)  # fmt: skip
            k = index.get(key)
            if k is None:
                k = index[key] = len(index)
            rows.setting.append(k)
            if key[5:] != (1.0, 0.0, 0.0) and p.uses_penalties:
                rows.output_ids[i] = list(r.output_token_ids)
                if p.repetition_penalty != 1.0:
                    rows.prompt_ids[i] = list(r.prompt_token_ids)
        rows.seeds = [r.seed for r in requests]
        rows.num_output_tokens = [r.num_output_tokens for r in requests]
        rows.num_pending = [r.num_pending for r in requests]
        rows.settings = list(index)
        return rows

    def rows(self) -> list[SampleRow]:
        params = [SamplingParams(**dict(zip(_SAMPLING_FIELDS, s))) for s in self.settings]
        return [
            SampleRow(params[k], seed, n, pending, self.output_ids.get(i, []),
                      self.prompt_ids.get(i, []))
            for i, (k, seed, n, pending) in enumerate(
                zip(self.setting, self.seeds, self.num_output_tokens, self.num_pending)
            )
        ]  # fmt: skip


@dataclass
class StepMessage:
    host: HostInputs
    pending_src: list[int]  # for each pending row: its row in the previous step's sampled ids
    rows: SampleRows


def launch_parallel(
    runner: ModelRunner, plan: SchedulerOutput, in_flight: LaunchedStep | None
) -> LaunchedStep:
    """Rank 0's ``launch``: broadcast the step, then run it."""
    host, pending_requests = build_host_inputs(plan, runner.page_size)
    src: list[int] = []
    prev = None
    if pending_requests:
        if in_flight is None or in_flight.token_ids is None:
            raise RuntimeError("a step has pending tokens but no step is in flight")
        row_of = in_flight.row_of()
        src, prev = [row_of[r.request_id] for r in pending_requests], in_flight.token_ids
    requests = [plan.chunks[i].request for i in host.sampled_chunks]
    assert runner.plans is not None
    runner.plans.send(StepMessage(host, src, SampleRows.of(requests)))
    out = run_host_step(runner, host, src, prev, requests)
    return LaunchedStep.empty(plan) if out is None else LaunchedStep.start(plan, requests, out)


def run_host_step(
    runner: ModelRunner,
    host: HostInputs,
    pending_src: list[int],
    prev: torch.Tensor | None,
    rows: Sequence[Request | SampleRow],
) -> SamplerOutput | None:
    inputs = device_inputs(host, runner.device)
    if pending_src:
        if prev is None:
            raise RuntimeError("a step has pending tokens but no sampled ids to fill them from")
        fill_pending_rows(inputs, pending_src, prev)
    return runner.execute(inputs, rows)
