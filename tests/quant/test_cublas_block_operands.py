"""The operands ``blockwise_scaled_mm`` hands cuBLASLt's block-scaled FP8 GEMM: x's scales
M-major over a multiple of 4 rows, x's e4m3 rows padded to match. The GEMM itself is sm_90 only
(``tests/gpu/test_fp8_kernels.py``); the padding is plain torch and runs here."""

from __future__ import annotations

import pytest
import torch

from kvserve.kernels.fp8_gemm import CUBLAS_BLOCKWISE_ROWS, rows_padded_for_cublas
from kvserve.kernels.fp8_quant import dequantize_fp8_activation, quantize_fp8


@pytest.mark.parametrize("m", [1, 3, 4, 65, 100])
@pytest.mark.parametrize("m_major", [False, True])
def test_rows_pad_to_a_multiple_of_four_with_zero_rows(m: int, m_major: bool) -> None:
    x = torch.randn(m, 512, generator=torch.Generator().manual_seed(m))
    xq, xs = quantize_fp8(x, 128, scales_m_major=m_major)
    padded_q, padded_s = rows_padded_for_cublas(xq, xs)
    rows = -(-m // CUBLAS_BLOCKWISE_ROWS) * CUBLAS_BLOCKWISE_ROWS
    assert padded_q.shape == (rows, 512) and padded_q.dtype == xq.dtype
    assert padded_s.shape == (rows, 4) and padded_s.stride() == (1, rows)
    assert torch.equal(padded_q[:m].view(torch.uint8), xq.view(torch.uint8))
    assert torch.equal(padded_s[:m], xs)
    assert not padded_q[m:].view(torch.uint8).any()
    assert torch.equal(
        dequantize_fp8_activation(padded_q, padded_s)[:m], dequantize_fp8_activation(xq, xs)
    )
    assert not dequantize_fp8_activation(padded_q, padded_s)[m:].any()


def test_rows_already_a_multiple_of_four_are_not_copied() -> None:
    xq, xs = quantize_fp8(torch.randn(8, 256), 128, scales_m_major=True)
    padded_q, padded_s = rows_padded_for_cublas(xq, xs)
    assert padded_q.data_ptr() == xq.data_ptr() and padded_s.data_ptr() == xs.data_ptr()
