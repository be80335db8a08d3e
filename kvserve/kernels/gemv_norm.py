"""RMSNorm (with the residual add before it) as the word GEMV's prologue, in place of the norm
kernel before the projection it feeds.

At a decode step of a few tokens the norm kernel is a launch of its own on the step's critical
path (2 us a norm on the H200, two norms a layer) for 8 KB of work. Folded into the GEMV, each
program of the launch computes the row's statistics itself, while its first weight loads,
issued before the dependent-launch wait, are in flight: it reads the whole row of ``x`` and of
the residual (from L2, where the kernel before left them), sums the squares, then writes the
normed values of its own K range to a scratch row that its K steps read as x. The programs
that share a K range write the same values there: every program sums in the same order, so
they agree to the bit. The first program also writes ``x + residual`` to ``residual_out``
(never over the residual the others still read).

The normed values follow ``rmsnorm.rms_norm_reference`` (the statistics in fp32, rounded to x's
dtype before the weight); the sum of squares runs in another order than the norm kernel's, so
the two can differ in the last bit of a normed value.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from kvserve.config import env_switch
from kvserve.kernels._triton import constexpr, jit, tl
from kvserve.kernels.rmsnorm import fused_add_rms_norm_reference, rms_norm_reference

NORM_CHUNK = constexpr(1024)  # values of a row a program reads at once
NORM_IN_GEMV_ENV = "KVSERVE_NORM_IN_GEMV"


@functools.cache
def norm_in_gemv_enabled() -> bool:
    """``KVSERVE_NORM_IN_GEMV``: 1 folds a decoder layer's input norm into its q/k/v GEMV and a
    dense layer's post-attention norm into its gate/up GEMV, on steps those run on the word
    GEMV; 0 (the default until timed) keeps the norm kernel."""
    return env_switch(NORM_IN_GEMV_ENV, default=False)


@dataclass(frozen=True)
class RowNorm:
    """``rms_norm(x + residual) * weight`` as a GEMV's input; ``residual_out`` [M, K] takes
    ``x + residual``. Without a residual, ``rms_norm(x)`` (and no ``residual_out``)."""

    weight: torch.Tensor  # [K]
    eps: float
    residual: torch.Tensor | None = None  # [M, K], x's dtype, unit column stride
    residual_out: torch.Tensor | None = None  # [M, K], contiguous


def row_norm_reference(x: torch.Tensor, norm: RowNorm) -> torch.Tensor:
    """The normed rows a ``RowNorm`` GEMV multiplies (and ``residual_out`` filled)."""
    if norm.residual is None:
        return rms_norm_reference(x, norm.weight, norm.eps)
    normed, summed = fused_add_rms_norm_reference(x, norm.residual, norm.weight, norm.eps)
    if norm.residual_out is not None:
        norm.residual_out.copy_(summed)
    return normed


def check_row_norm(x: torch.Tensor, norm: RowNorm) -> None:
    m, k = x.shape
    ok = norm.weight.shape == (k,) and norm.weight.stride(0) == 1
    if norm.residual is not None:
        r, out = norm.residual, norm.residual_out
        ok = ok and r.shape == x.shape and r.dtype == x.dtype and r.stride(1) == 1
        ok = ok and out is not None and out.shape == x.shape and out.is_contiguous()
    if not ok or x.stride(1) != 1:
        raise ValueError(f"RowNorm does not fit x {tuple(x.shape)}: {norm}")


@jit
def _summed(x_ptr, r_ptr, row, stride_xm, stride_rm, k, mask, HAS_RESIDUAL: tl.constexpr):
    """x + residual at columns ``k`` of ``row``, rounded to x's dtype as torch's add rounds."""
    s = tl.load(x_ptr + row * stride_xm + k, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + row * stride_rm + k, mask=mask, other=0.0)
        s = (s.to(tl.float32) + r.to(tl.float32)).to(s.dtype)
    return s


@jit
def norm_prologue(
    x_ptr, r_ptr, w_ptr, xn_ptr, r_out_ptr, stride_xm, stride_rm, M, K, k_lo, k_hi, eps,
    first_program, HAS_RESIDUAL: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    """Writes rows 0..M-1 of rms_norm(x + r) * w, columns k_lo..k_hi-1, to ``xn`` ([M, K],
    row stride K); the ``first_program`` writes x + r to ``r_out`` too. Ends on a barrier, so
    the program's threads then read ``xn``."""
    cols = tl.arange(0, NORM_CHUNK)
    for m in tl.static_range(ROWS):
        if m < M:
            row = m
            squares = tl.zeros([NORM_CHUNK], dtype=tl.float32)
            for k0 in range(0, K, NORM_CHUNK):
                k = k0 + cols
                s = _summed(x_ptr, r_ptr, row, stride_xm, stride_rm, k, k < K, HAS_RESIDUAL)
                if HAS_RESIDUAL:
                    tl.store(r_out_ptr + row * K + k, s, mask=(k < K) & first_program)
                sf = s.to(tl.float32)
                squares += sf * sf
            rstd = tl.rsqrt(tl.sum(squares, 0) / K + eps)
            for k0 in range(k_lo, k_hi, NORM_CHUNK):
                k = k0 + cols
                mask = k < k_hi
                s = _summed(x_ptr, r_ptr, row, stride_xm, stride_rm, k, mask, HAS_RESIDUAL)
                normed = (s.to(tl.float32) * rstd).to(s.dtype).to(tl.float32)
                w = tl.load(w_ptr + k, mask=mask, other=0.0).to(tl.float32)
                tl.store(xn_ptr + row * K + k, (normed * w).to(s.dtype), mask=mask)
    tl.debug_barrier()
