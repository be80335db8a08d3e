"""What the FP4 MMA GEMM (``fp4_gemm.py``) and the CUDA-core GEMV (``fp4_gemv.py``) share:
the GEMV's config and row limit, and the epilogue that scales, biases and stores an output
tile. Kept apart so that neither kernel module imports the other."""

from __future__ import annotations

from dataclasses import dataclass

from kvserve.kernels._triton import jit, tl
from kvserve.kernels.skinny_gemm import _store_out_tile

GEMV_ROWS = 4  # the most rows the GEMV kernel takes


@dataclass(frozen=True)
class Fp4GemvConfig:
    """The CUDA-core kernel for at most GEMV_ROWS rows (``fp4_gemv.py``)."""

    block_n: int = 128  # rows of W per program
    groups: int = 4  # scale groups per K step
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4

    def __post_init__(self) -> None:
        for b in (self.block_n, self.groups):
            if b < 1 or b & (b - 1):
                raise ValueError(f"block_n and groups must be powers of two: {self}")
        if self.split_k < 1:
            raise ValueError(f"split_k must be >= 1: {self}")


@jit
def _epilogue(
    acc,
    rs_ptr,
    bias_ptr,
    out_ptr,
    rn,
    rm,
    M,
    N,
    stride_om,
    HAS_ROW_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """Row scale and bias on the fp32 tile [BLOCK_N, BLOCK_M], then the transposed store."""
    if HAS_ROW_SCALE:
        acc = acc * tl.load(rs_ptr + rn, mask=rn < N, other=0.0)[:, None]
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[:, None]
    _store_out_tile(out_ptr, acc, rn, rm, M, N, stride_om)
