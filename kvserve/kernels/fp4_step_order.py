"""Where x's columns go in the asynchronous FP4 GEMM's K-step permutation
(``fp4_async_decode``: its module docstring, and ``permute_x_steps``, the torch reference), as
Triton helpers for the kernels that write x in it: the permutation's own kernel
(``fp4_x_permute``) and the producers of x (``rmsnorm``, ``activation``), which store their
output permuted so that the GEMM needs no copy of its own. Without Gluon: a norm imports it.
"""

from __future__ import annotations

import torch

from kvserve.kernels._triton import constexpr, jit, tl

STEP_K = 128  # K a step: the permutation stays within each step of 128 columns
_STEP = constexpr(STEP_K)


@jit
def step_source_columns(p, BITS: tl.constexpr):
    """The natural column of x that lands at permuted column ``p`` (any shape of int)."""
    r = p % _STEP  # p's column within its step: 32 kbhi + 16 kblo + 8 h + 2 q + e
    kbhi = r // 32
    kblo = (r // 16) % 2
    h = (r // 8) % 2
    q = (r // 2) % 4
    e = r % 2
    # the bit-placing decode (BITS) pairs a word's codes j and j + 4
    within = 4 * e + 2 * kblo + h if BITS else 4 * kblo + 2 * h + e
    return p - r + 32 * q + 8 * kbhi + within


@jit
def step_positions(k, BITS: tl.constexpr):
    """The permuted column natural column ``k`` goes to: ``step_source_columns``' inverse, for
    a producer that stores its output in the permutation (``rmsnorm``, ``activation``)."""
    s = k % _STEP  # 32 q + 8 kbhi + within
    q = s // 32
    kbhi = (s // 8) % 4
    within = s % 8
    if BITS:  # within = 4 e + 2 kblo + h
        placed = 16 * ((within // 2) % 2) + 8 * (within % 2) + within // 4
    else:  # within = 4 kblo + 2 h + e
        placed = 16 * (within // 4) + 8 * ((within // 2) % 2) + within % 2
    return k - s + 32 * kbhi + 2 * q + placed


def check_step_order(k: int, step_order: bool | None) -> None:
    """A producer asked to write its K = ``k`` columns in the step permutation (``step_order``
    not None: the GEMM's ``bits``) must have whole steps."""
    if step_order is not None and k % STEP_K:
        raise ValueError(f"the FP4 step permutation needs K a multiple of {STEP_K}, got {k}")


def permute_x_steps(x: torch.Tensor, bits: bool = False) -> torch.Tensor:
    """x [M, K] with each 128-column step's columns in the kernel's permutation (the module
    docstring): natural column k = 32 q + 8 kbhi + 4 kblo + 2 h + e goes to column
    p = 32 kbhi + 16 kblo + 8 h + 2 q + e; with ``bits`` (the bit-placing decode, which pairs
    a word's codes j and j + 4), k = 32 q + 8 kbhi + 4 e + 2 kblo + h. A new contiguous tensor
    (one copy)."""
    m, k = x.shape
    # natural columns as [m, step, q, kbhi, e, kblo, h] (bits) or [m, step, q, kbhi, kblo, h, e],
    # each ordered to [m, step, kbhi, kblo, h, q, e]
    order = (0, 1, 3, 5, 6, 2, 4) if bits else (0, 1, 3, 4, 5, 2, 6)
    return x.reshape(m, k // STEP_K, 4, 4, 2, 2, 2).permute(order).reshape(m, k)
