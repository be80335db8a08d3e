"""RMSNorm, optionally fused with the residual add that precedes it, and optionally writing
e4m3 for the FP8 layer it feeds (``forward_fp8``) or its columns in the order of the FP4 layer
it feeds (``forward_permuted``)."""

from __future__ import annotations

import torch
from torch import nn

from kvserve.kernels.fp4_step_order import permute_x_steps
from kvserve.kernels.options import TORCH_REFERENCE, KernelOptions
from kvserve.kernels.rmsnorm import fused_add_rms_norm_reference, rms_norm_reference
from kvserve.kernels.rmsnorm_fp8 import rms_norm_fp8, rms_norm_fp8_reference
from kvserve.quant.fp8_activation import Fp8Activation, Fp8InputScheme
from kvserve.quant.permuted_activation import PermutedActivation


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

    def forward_fp8(
        self, x: torch.Tensor, residual: torch.Tensor | None, scheme: Fp8InputScheme
    ) -> tuple[Fp8Activation, torch.Tensor]:
        """``forward`` with its output quantized as ``scheme`` says, in one kernel on the
        Triton path (``kernels.rmsnorm_fp8``): ``(norm(x (+ residual)) in e4m3, x (+
        residual))``; without ``residual`` the second is ``x`` itself."""
        args = (self.weight, self.eps, scheme.group, scheme.static_scale, scheme.scales_m_major)
        if self.kernels.triton:
            q, scales = rms_norm_fp8(x, residual, *args, pdl=self.kernels.pdl)
        else:
            q, scales = rms_norm_fp8_reference(x, residual, *args)
        normed = Fp8Activation(q, scales, torch.promote_types(x.dtype, self.weight.dtype))
        return normed, (x if residual is None else residual)

    def forward_permuted(
        self, x: torch.Tensor, residual: torch.Tensor | None, bits: bool
    ) -> tuple[PermutedActivation, torch.Tensor]:
        """``forward`` with its output's columns in the asynchronous FP4 GEMM's K-step order
        for its ``bits`` decode, in the norm's one kernel on the Triton path: ``(norm(x (+
        residual)) permuted, x (+ residual))``; without ``residual`` the second is ``x``."""
        if self.kernels.triton:
            from kvserve.kernels import rmsnorm

            pdl = self.kernels.pdl
            if residual is None:
                normed = rmsnorm.rms_norm(x, self.weight, self.eps, pdl=pdl, step_order=bits)
                return PermutedActivation(normed, bits), x
            normed, residual = rmsnorm.fused_add_rms_norm(
                x, residual, self.weight, self.eps, pdl=pdl, step_order=bits
            )
            return PermutedActivation(normed, bits), residual
        out = self.forward(x, residual)
        normed, summed = out if residual is not None else (out, x)
        return PermutedActivation(permute_x_steps(normed, bits), bits), summed
