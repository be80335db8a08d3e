"""Builds the sampler's per-row tensors from the chunks that sample this step."""

from __future__ import annotations

import torch

from kvserve.engine.core.request import Request
from kvserve.engine.runner.device import to_device
from kvserve.layers.sampler import PenaltyBatch, SamplingBatch


def _padded(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    width = max(1, max(len(r) for r in rows))
    out = torch.full((len(rows), width), -1, dtype=torch.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(r, dtype=torch.int64)
    return to_device(out, torch.int64, device)


def _penalties(requests: list[Request], device: torch.device) -> PenaltyBatch | None:
    if not any(r.params.uses_penalties for r in requests):
        return None

    def column(name: str) -> torch.Tensor:
        return to_device([getattr(r.params, name) for r in requests], torch.float32, device)

    return PenaltyBatch(
        repetition=column("repetition_penalty"),
        presence=column("presence_penalty"),
        frequency=column("frequency_penalty"),
        output_ids=_padded([r.output_token_ids for r in requests], device),
        prompt_ids=_padded(
            [r.prompt_token_ids if r.params.repetition_penalty != 1.0 else [] for r in requests],
            device,
        ),
    )


def build_sampling_batch(
    requests: list[Request], vocab_size: int, device: torch.device
) -> SamplingBatch:
    params = [r.params for r in requests]

    def tensor(values: list[float] | list[int], dtype: torch.dtype) -> torch.Tensor:
        return to_device(values, dtype, device)

    wants_logprobs = [p.logprobs for p in params if p.logprobs is not None]
    all_greedy = all(p.greedy for p in params)
    batch = SamplingBatch(
        all_greedy=all_greedy,
        use_top_k_top_p=any(not p.greedy and (p.top_k > 0 or p.top_p < 1) for p in params),
        use_min_p=any(not p.greedy and p.min_p > 0 for p in params),
        penalties=_penalties(requests, device),
        max_logprobs=max(wants_logprobs) if wants_logprobs else None,
    )
    if not all_greedy:  # greedy rows need no per-row tensors: skip the host->device copies
        batch.temperature = tensor([p.temperature for p in params], torch.float32)
        batch.top_k = tensor([p.top_k if p.top_k > 0 else vocab_size for p in params], torch.int64)
        batch.top_p = tensor([p.top_p for p in params], torch.float32)
        batch.min_p = tensor([p.min_p for p in params], torch.float32)
        batch.seeds = tensor([r.seed for r in requests], torch.int64)
        # Output index of the token being sampled: its pending count includes this step's.
        batch.steps = tensor(
            [r.num_output_tokens + r.num_pending - 1 for r in requests], torch.int64
        )
    return batch
