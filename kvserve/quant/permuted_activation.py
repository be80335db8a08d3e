"""An activation handed to an FP4 linear layer already in its asynchronous GEMM's K-step order,
by the kernel that produced it (the RMSNorm before q/k/v or gate/up), so that the GEMM runs no
permutation of its own (``kernels.fp4_step_order``).

A layer's method says which order a step would permute x into (``LinearMethod.step_order``:
the GEMM's ``bits``, or None); the producer writes x that way and the layer multiplies
(``LinearMethod.apply_permuted``). Only the FP4 method names an order, so no other method
receives a ``PermutedActivation``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PermutedActivation:
    """``values [T, K]`` in the model dtype, each 128-column step's columns in the order of
    the GEMM's ``bits`` decode (``fp4_step_order.permute_x_steps``)."""

    values: torch.Tensor
    bits: bool
