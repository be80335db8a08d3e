"""RMSNorm, optionally fused with the residual add that precedes it."""

from __future__ import annotations

import torch
from torch import nn


def rms_norm_native(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # HF semantics: normalise in fp32, cast back before scaling by the weight.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype), False)
        self.use_kernel = False  # set by the model runner on CUDA (see kvserve.kernels.rmsnorm)
        self.pdl = False  # with use_kernel: programmatic dependent launch (sm_90+)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without ``residual``: norm(x). With it: (norm(x + residual), x + residual)."""
        if self.use_kernel:
            from kvserve.kernels import rmsnorm

            if residual is None:
                return rmsnorm.rms_norm(x, self.weight, self.eps, pdl=self.pdl)
            return rmsnorm.fused_add_rms_norm(x, residual, self.weight, self.eps, pdl=self.pdl)
        if residual is None:
            return rms_norm_native(x, self.weight, self.eps)
        summed = x + residual
        return rms_norm_native(summed, self.weight, self.eps), summed
