"""SiLU-and-multiply for gated MLPs: input [T, 2I] holds gate then up."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def silu_and_mul_native(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


class SiluAndMul(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.use_kernel = False
        self.pdl = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_kernel:
            from kvserve.kernels.activation import silu_and_mul

            return silu_and_mul(x, pdl=self.pdl)
        return silu_and_mul_native(x)
