"""Token embedding and the LM head (which may share the embedding's weight).

Under tensor parallelism both are vocabulary-parallel: rank r holds rows
[r * V', (r + 1) * V') of the vocabulary (V' = ceil(V / size), the last slice zero-padded).
The embedding zeroes rows of tokens outside its slice and all-reduces; the LM head computes
its slice of the logits and all-gathers them, so every rank has the full logits."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.distributed.collectives import all_gather_last_dim, all_reduce
from kvserve.distributed.parallel_state import SINGLE, TPGroup


def _vocab_slice(
    vocab_size: int, hidden_size: int, dtype: torch.dtype, tp: TPGroup
) -> tuple[int, int, nn.Parameter]:
    """(first row, rows, weight) of this rank's vocabulary slice; under tensor parallelism the
    weight carries a loader that takes its rows of the full [V, H] checkpoint tensor."""
    rows = -(-vocab_size // tp.size)
    first = tp.rank * rows
    weight = nn.Parameter(torch.empty(rows, hidden_size, dtype=dtype), False)
    if tp.is_parallel:

        def load(loaded: torch.Tensor) -> None:
            part = loaded[first : first + rows]
            weight.data.zero_()  # padding rows past the vocabulary stay zero
            weight.data[: part.shape[0]].copy_(part)

        weight.weight_loader = load  # type: ignore[attr-defined]
    return first, rows, weight


class VocabEmbedding(nn.Module):
    def __init__(
        self, vocab_size: int, hidden_size: int, dtype: torch.dtype, tp: TPGroup = SINGLE
    ) -> None:
        super().__init__()
        self.vocab_size, self.tp = vocab_size, tp
        self.first, self.rows, self.weight = _vocab_slice(vocab_size, hidden_size, dtype, tp)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        if not self.tp.is_parallel:
            return F.embedding(token_ids, self.weight)
        local = token_ids - self.first
        outside = (local < 0) | (local >= self.rows)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return all_reduce(out.masked_fill_(outside.unsqueeze(-1), 0), self.tp)


class LMHead(nn.Module):
    """Logits in float32 for the rows given (the last token of each sampled sequence)."""

    def __init__(
        self, vocab_size: int, hidden_size: int, dtype: torch.dtype, tied: VocabEmbedding | None,
        tp: TPGroup = SINGLE,
    ) -> None:  # fmt: skip
        super().__init__()
        self.tied, self.tp, self.vocab_size = tied, tp, vocab_size
        if tied is None:
            _, _, self.weight = _vocab_slice(vocab_size, hidden_size, dtype, tp)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.tied.weight if self.tied is not None else self.weight
        logits = F.linear(hidden, weight).float()
        if not self.tp.is_parallel:
            return logits
        return all_gather_last_dim(logits, self.tp)[:, : self.vocab_size]
