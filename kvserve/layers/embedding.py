"""Token embedding and the LM head (which may share the embedding's weight)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype), False)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(token_ids, self.weight)


class LMHead(nn.Module):
    """Logits in float32 for the rows given (the last token of each sampled sequence)."""

    def __init__(
        self, vocab_size: int, hidden_size: int, dtype: torch.dtype, tied: VocabEmbedding | None
    ) -> None:
        super().__init__()
        self.tied = tied
        if tied is None:
            self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype), False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.tied.weight if self.tied is not None else self.weight
        return F.linear(hidden, weight).float()
