"""RMSNorm, optionally fused with the residual add that precedes it."""

from __future__ import annotations

import torch
from torch import nn

from kvserve.kernels.options import TORCH_REFERENCE, KernelOptions
from kvserve.kernels.rmsnorm import fused_add_rms_norm_reference, rms_norm_reference


class RMSNorm(nn.Module):
    def __init__(
        self, size: int, eps: float, dtype: torch.dtype, kernels: KernelOptions = TORCH_REFERENCE
    ) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype), False)
        self.kernels = kernels

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without ``residual``: norm(x). With it: (norm(x + residual), x + residual)."""
        if self.kernels.triton:
            from kvserve.kernels import rmsnorm

            pdl = self.kernels.pdl
            if residual is None:
                return rmsnorm.rms_norm(x, self.weight, self.eps, pdl=pdl)
            return rmsnorm.fused_add_rms_norm(x, residual, self.weight, self.eps, pdl=pdl)
        if residual is None:
            return rms_norm_reference(x, self.weight, self.eps)
        return fused_add_rms_norm_reference(x, residual, self.weight, self.eps)
