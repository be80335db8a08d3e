"""An activation handed to an FP8 linear layer already quantized, by the kernel that produced
it (``kernels.rmsnorm_fp8``), and how that layer wants it quantized.

A layer's method says how it would quantize a step's x by a separate kernel
(``LinearMethod.fp8_input_scheme``: the scale's group, or its static scale); the producer
quantizes that way and the layer multiplies (``LinearMethod.apply_fp8``). Only the FP8 method
names a scheme, so no other method receives an ``Fp8Activation``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Fp8InputScheme:
    """``group``: columns a dynamic scale covers (None: the whole row); ``static_scale``: the
    one fp32 scale of every value instead (then ``group`` is unused); ``scales_m_major``: the
    dynamic scales ``[T, groups]`` with strides ``(1, T)`` (cuBLASLt's block-scaled GEMM)."""

    group: int | None
    static_scale: torch.Tensor | None = None
    scales_m_major: bool = False


@dataclass(frozen=True)
class Fp8Activation:
    """``q [T, K]`` float8_e4m3fn with its ``scales`` (``[T, K / group]``, ``[T, 1]`` or the
    static ``[1]``): x ~= q * scale. ``dtype``: the dtype x had, which the output takes."""

    q: torch.Tensor
    scales: torch.Tensor
    dtype: torch.dtype
