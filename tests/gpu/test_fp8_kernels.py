"""FP8 kernels on the GPU against their torch references: activation quantization (per token,
per group, static), torch._scaled_mm (per-tensor / per-channel weights x static / per-token
activations) and the Triton block-scaled GEMM; shapes that do and do not fill the tiles, batch
1 to 256."""

from __future__ import annotations

import pytest
import torch

from kvserve.kernels.fp8_gemm import fp8_block_gemm, fp8_gemm_reference, scaled_mm
from kvserve.kernels.fp8_quant import quantize_fp8, quantize_fp8_reference
from kvserve.quant.fp8_weights import quantize_weight

pytestmark = pytest.mark.gpu
pytest.importorskip("triton")

ROWS = (1, 3, 16, 64, 100, 256)


def _needs_fp8() -> None:
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 tensor cores need sm_89+")


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize(("k", "group"), [(128, None), (4096, None), (14336, None), (4096, 128)])
def test_activation_quant_matches_reference(m: int, k: int, group: int | None) -> None:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 3
    q, s = quantize_fp8(x, group)
    q_ref, s_ref = quantize_fp8_reference(x, group)
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=0)
    assert (q.float() != q_ref.float()).float().mean() < 1e-3  # rounding ties only
    static = torch.tensor([0.05], device="cuda")
    q, s = quantize_fp8(x, None, static)
    assert s is static
    q_ref, _ = quantize_fp8_reference(x, None, static)
    assert (q.float() != q_ref.float()).float().mean() < 1e-3


def _relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize(("n", "k"), [(256, 512), (6144, 4096), (1024, 4096), (4096, 14336)])
@pytest.mark.parametrize(
    ("weight", "act"),
    [("tensor", "static"), ("tensor", "token"), ("channel", "token"), ("channel", "static")],
)
def test_scaled_mm_matches_reference(m: int, n: int, k: int, weight: str, act: str) -> None:
    _needs_fp8()
    torch.manual_seed(m + n + k)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w, ws = quantize_weight(torch.randn(n, k, device="cuda") * 0.02, weight)
    static = torch.tensor([4.0 / 448], device="cuda") if act == "static" else None
    xq, xs = quantize_fp8(x, None, static)
    out = scaled_mm(xq, xs, w, ws, torch.bfloat16)
    ref = fp8_gemm_reference(xq, xs, w, ws, torch.float32)
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    assert _relative_error(out, ref) < 1e-2


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize(("n", "k"), [(256, 512), (200, 384), (6144, 4096), (4096, 14336)])
def test_block_gemm_matches_reference(m: int, n: int, k: int) -> None:
    _needs_fp8()
    torch.manual_seed(m + n + k)
    block = (128, 128)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w, ws = quantize_weight(torch.randn(n, k, device="cuda") * 0.02, "block", block)
    xq, xs = quantize_fp8(x, 128)
    out = fp8_block_gemm(xq, xs, w, ws, block, torch.bfloat16)
    ref = fp8_gemm_reference(xq, xs, w, ws, torch.float32, block)
    assert _relative_error(out, ref) < 1e-2


def test_block_gemm_is_capturable_in_a_cuda_graph() -> None:
    _needs_fp8()
    block = (128, 128)
    x = torch.randn(8, 512, device="cuda", dtype=torch.bfloat16)
    w, ws = quantize_weight(torch.randn(256, 512, device="cuda") * 0.02, "block", block)

    def step() -> torch.Tensor:
        xq, xs = quantize_fp8(x, 128)
        return fp8_block_gemm(xq, xs, w, ws, block, torch.bfloat16)

    eager = step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.testing.assert_close(captured, step())
    assert not torch.equal(captured, eager)
