"""SiLU-and-multiply for gated MLPs: input [T, 2I] holds gate then up."""

from __future__ import annotations

import torch
from torch import nn

from kvserve.kernels.activation import silu_and_mul_reference
from kvserve.kernels.options import TORCH_REFERENCE, KernelOptions


class SiluAndMul(nn.Module):
    def __init__(self, kernels: KernelOptions = TORCH_REFERENCE) -> None:
        super().__init__()
        self.kernels = kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels.triton:
            from kvserve.kernels.activation import silu_and_mul

            return silu_and_mul(x, pdl=self.kernels.pdl)
        return silu_and_mul_reference(x)
