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
    """Logits in float32 for the rows given (the last token of each sampled sequence).

    With ``use_kernel`` (set by the model runner on CUDA), up to ``MAX_ROWS`` rows on Hopper go
    through the skinny Triton GEMM: on the H200 it streams a 128K-vocabulary weight at 94-102%
    of copy bandwidth where cuBLAS gets 87-99% (benchmarks/skinny_gemm.py); on the smaller
    projections the two are even, so those stay on cuBLAS."""

    def __init__(
        self, vocab_size: int, hidden_size: int, dtype: torch.dtype, tied: VocabEmbedding | None
    ) -> None:
        super().__init__()
        self.tied = tied
        if tied is None:
            self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype), False)
        self.use_kernel = False

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.tied.weight if self.tied is not None else self.weight
        if self.use_kernel:
            from kvserve.kernels import skinny_gemm

            if hidden.shape[0] <= skinny_gemm.MAX_ROWS and skinny_gemm.is_hopper(hidden.device):
                return skinny_gemm.skinny_linear(hidden, weight).float()
        return F.linear(hidden, weight).float()
