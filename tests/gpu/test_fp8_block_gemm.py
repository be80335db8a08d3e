"""The Triton block-scaled FP8 GEMM (128 x 128 weight blocks, x per 1 x 128 group) over grids of
several row and column tiles: every tile computed once whatever the order the programs take
them in (``group_m``: the same bits), against the fp32 reference, with x's scales in either
layout. Llama-sized shapes and cuBLASLt's block-scaled GEMM are in ``test_fp8_kernels.py``.

``KVSERVE_TEST_DEVICE=cpu TRITON_INTERPRET=1 pytest --noconftest tests/gpu/test_fp8_block_gemm.py``
runs it through Triton's interpreter on a CPU.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernel_test_device import DEVICE  # noqa: E402

from kvserve.kernels.fp8_gemm import fp8_block_gemm, fp8_gemm_reference  # noqa: E402
from kvserve.kernels.fp8_quant import launch_quant_kernel  # noqa: E402
from kvserve.quant.fp8_weights import quantize_weight  # noqa: E402

pytestmark = pytest.mark.gpu
BLOCK = (128, 128)
# (rows, columns, K): one row tile of 16 / 64 rows (decode steps); 3 x 5 tiles; 9 row tiles
# (a last group of one past 8); ragged N and a K of three blocks
SHAPES = [(3, 256, 512), (64, 384, 256), (300, 640, 256), (1100, 384, 256), (200, 200, 384)]


def _inputs(m: int, n: int, k: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(m * 7 + n + k)
    x = torch.randn(m, k, generator=gen).to(DEVICE)
    w, ws = quantize_weight((torch.randn(n, k, generator=gen) * 0.02).to(DEVICE), "block", BLOCK)
    return x, w, ws


@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_every_tile_once_in_any_order(m: int, n: int, k: int) -> None:
    x, w, ws = _inputs(m, n, k)
    xq, xs = launch_quant_kernel(x, 128, None, False, False)
    grouped = fp8_block_gemm(xq, xs, w, ws, BLOCK, torch.float32)
    ref = fp8_gemm_reference(xq, xs, w, ws, torch.float32, BLOCK)
    # Hopper's FP8 MMA keeps about 14 bits of its running sum (DeepSeek-V3, section 3.3.2), the
    # interpreter all of fp32; a tile missed or computed twice is off by the whole product
    tol = 2e-3 if DEVICE.type == "cuda" else 1e-4
    torch.testing.assert_close(grouped, ref, rtol=tol, atol=tol * float(ref.abs().max()))
    for group_m in (1, 2):
        row_order = fp8_block_gemm(xq, xs, w, ws, BLOCK, torch.float32, group_m=group_m)
        assert torch.equal(row_order, grouped)


@pytest.mark.parametrize(("m", "n", "k"), SHAPES[1:3])
def test_x_scales_in_either_layout_give_the_same_bits(m: int, n: int, k: int) -> None:
    """M-major scales (what cuBLASLt reads, written so where it takes the step) or row-major."""
    x, w, ws = _inputs(m, n, k)
    xq, xs = launch_quant_kernel(x, 128, None, False, False)
    mq, m_scales = launch_quant_kernel(x, 128, None, False, False, scales_m_major=True)
    assert m_scales.stride() == (1, m)
    row_major = fp8_block_gemm(xq, xs, w, ws, BLOCK, torch.float32)
    assert torch.equal(fp8_block_gemm(mq, m_scales, w, ws, BLOCK, torch.float32), row_major)
