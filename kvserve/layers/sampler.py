"""Batched sampling on the logits' device: penalties, temperature, min-p, top-k/top-p, then a
Gumbel-max draw whose noise is a hash of (request seed, output index, token id). The noise of a
request therefore never depends on its batch mates or on the order of rows, so a seeded request
gives the same tokens whatever else runs, and no per-request generator or host sync is needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_M32 = 0xFFFFFFFF


@dataclass
class SamplingBatch:
    """Per-row sampling settings as device tensors, built once per step by the runner. The
    per-row tensors are only set when some row samples at random (``all_greedy`` False)."""

    all_greedy: bool
    use_top_k_top_p: bool
    use_min_p: bool
    penalties: PenaltyBatch | None
    max_logprobs: int | None  # most top-N logprobs any row wants (None: no row wants any)
    temperature: torch.Tensor | None = None  # float32 [B]; rows with 0 are greedy
    top_k: torch.Tensor | None = None  # int64 [B]; vocab size when off
    top_p: torch.Tensor | None = None  # float32 [B]
    min_p: torch.Tensor | None = None  # float32 [B]
    seeds: torch.Tensor | None = None  # int64 [B]
    steps: torch.Tensor | None = None  # int64 [B]: index of the token being sampled


@dataclass
class PenaltyBatch:
    repetition: torch.Tensor  # float32 [B]
    presence: torch.Tensor  # float32 [B]
    frequency: torch.Tensor  # float32 [B]
    output_ids: torch.Tensor  # int64 [B, Lo], padded with -1
    prompt_ids: torch.Tensor  # int64 [B, Lp], padded with -1


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor  # int64 [B]
    logprob: torch.Tensor | None  # float32 [B]: log-softmax of the raw logits at the token
    top_ids: torch.Tensor | None  # int64 [B, N]
    top_logprobs: torch.Tensor | None  # float32 [B, N]


def _mix32(x: torch.Tensor) -> torch.Tensor:
    # 32-bit integer hash kept in int64 so every product stays below 2**63.
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & _M32
    return x ^ (x >> 16)


def uniform_noise(seeds: torch.Tensor, steps: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Uniform (0, 1) noise [B, V], a pure function of (seed, step, token id)."""
    row = _mix32((seeds & _M32) ^ _mix32((seeds >> 32) & _M32))
    row = _mix32(row ^ _mix32(steps & _M32))
    cols = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    x = _mix32(_mix32(row[:, None] ^ ((cols * 0x9E3779B1) & _M32)))
    return ((x >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def apply_penalties(logits: torch.Tensor, p: PenaltyBatch) -> torch.Tensor:
    vocab = logits.shape[1]

    def counts(ids: torch.Tensor) -> torch.Tensor:
        c = torch.zeros(ids.shape[0], vocab + 1, device=logits.device, dtype=logits.dtype)
        c.scatter_add_(1, ids.where(ids >= 0, vocab), torch.ones_like(ids, dtype=logits.dtype))
        return c[:, :vocab]

    out_counts = counts(p.output_ids)
    seen = (out_counts + counts(p.prompt_ids)) > 0
    rep = p.repetition[:, None]
    penalised = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(seen, penalised, logits)
    logits = logits - p.frequency[:, None] * out_counts
    return logits - p.presence[:, None] * (out_counts > 0).to(logits.dtype)


def _mask_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[1], device=logits.device)[None, :]
    drop = ranks >= top_k[:, None]
    probs = sorted_logits.softmax(dim=-1)
    # Drop a token once the mass before it already reaches top_p (the first is always kept).
    drop |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


class Sampler:
    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        """``logits``: float32 [B, V] straight from the LM head."""
        raw = logits
        logprob = top_ids = top_logprobs = None
        if batch.max_logprobs is not None:
            logprobs = raw.log_softmax(dim=-1)
        if batch.penalties is not None:
            logits = apply_penalties(logits, batch.penalties)
        greedy_ids = logits.argmax(dim=-1)
        if batch.all_greedy or batch.temperature is None:
            token_ids = greedy_ids
        else:
            token_ids = torch.where(
                batch.temperature == 0, greedy_ids, self._random_sample(logits, batch)
            )
        if batch.max_logprobs is not None:
            logprob = logprobs.gather(1, token_ids[:, None]).squeeze(1)
            if batch.max_logprobs > 0:
                top_logprobs, top_ids = logprobs.topk(batch.max_logprobs, dim=-1)
        return SamplerOutput(token_ids, logprob, top_ids, top_logprobs)

    def _random_sample(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        assert batch.temperature is not None and batch.seeds is not None and batch.steps is not None
        temperature = torch.where(batch.temperature == 0, 1.0, batch.temperature)
        logits = logits / temperature[:, None]
        if batch.use_min_p and batch.min_p is not None:
            probs = logits.softmax(dim=-1)
            threshold = probs.max(dim=-1, keepdim=True).values * batch.min_p[:, None]
            logits = logits.masked_fill(probs < threshold, float("-inf"))
        if batch.use_top_k_top_p and batch.top_k is not None and batch.top_p is not None:
            logits = _mask_top_k_top_p(logits, batch.top_k, batch.top_p)
        u = uniform_noise(batch.seeds, batch.steps, logits.shape[1])
        gumbel = -torch.log(-torch.log(u))
        return (logits + gumbel).argmax(dim=-1)
