"""FP8 kernels on the GPU against their torch references: activation quantization (per token,
per group, static), torch._scaled_mm (per-tensor / per-channel weights x static / per-token
activations), the Triton block-scaled GEMM and cuBLASLt's (sm_90); shapes that do and do not
fill the tiles, batch 1 to 256."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kvserve.kernels.fp8_gemm import (
    blockwise_scaled_mm,
    blockwise_scaled_mm_fits,
    fp8_block_gemm,
    fp8_gemm_reference,
    scaled_mm,
)
from kvserve.kernels.fp8_quant import quantize_fp8, quantize_fp8_reference
from kvserve.quant.fp8_activation import Fp8Activation
from kvserve.quant.fp8_config import Fp8Spec
from kvserve.quant.fp8_method import BLOCK_CUBLAS_ROWS_ENV, Fp8LinearMethod, block_cublas_min_rows
from kvserve.quant.fp8_weights import quantize_weight

sys.path.insert(0, str(Path(__file__).parents[1] / "quant"))
from fp8_helpers import cached_setting  # noqa: E402

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


def x_of(m: int, k: int) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(m + k)).to("cuda").bfloat16()


def _block_gemm_inputs(m: int, n: int, k: int) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(m + n + k)
    w, ws = quantize_weight(torch.randn(n, k, device="cuda") * 0.02, "block", (128, 128))
    return (*quantize_fp8(x_of(m, k), 128), w, ws)


def _needs_cublas_blockwise() -> None:
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("cuBLASLt's 1 x 128 by 128 x 128 FP8 recipe is sm_90 only")


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize(("n", "k"), [(256, 512), (6144, 4096), (4096, 14336)])
def test_blockwise_scaled_mm_matches_reference_and_the_triton_block_gemm(
    m: int, n: int, k: int
) -> None:
    _needs_cublas_blockwise()
    xq, xs, w, ws = _block_gemm_inputs(m, n, k)
    assert blockwise_scaled_mm_fits(w, (128, 128))
    out = blockwise_scaled_mm(xq, xs, w, ws, torch.bfloat16)
    ref = fp8_gemm_reference(xq, xs, w, ws, torch.float32, (128, 128))
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    assert _relative_error(out, ref) < 1e-2
    triton = fp8_block_gemm(xq, xs, w, ws, (128, 128), torch.bfloat16)
    assert _relative_error(out, triton.float()) < 1e-2
    # x's scales written M-major (as cuBLAS reads them): the same product from both GEMMs
    mq, m_scales = quantize_fp8(x_of(m, k), 128, scales_m_major=True)
    assert torch.equal(mq.view(torch.uint8), xq.view(torch.uint8))
    assert torch.equal(blockwise_scaled_mm(mq, m_scales, w, ws, torch.bfloat16), out)
    assert torch.equal(fp8_block_gemm(mq, m_scales, w, ws, (128, 128), torch.bfloat16), triton)


def test_blockwise_scaled_mm_refuses_what_cublas_does_not_take() -> None:
    """Ragged N, K / 128 not a multiple of 4 and other block shapes stay on the Triton GEMM."""
    _needs_cublas_blockwise()
    _, _, w, _ = _block_gemm_inputs(4, 256, 512)
    assert blockwise_scaled_mm_fits(w, (128, 128))
    assert not blockwise_scaled_mm_fits(w[:200], (128, 128))
    assert not blockwise_scaled_mm_fits(w[:, :384], (128, 128))
    assert not blockwise_scaled_mm_fits(w, (64, 128))
    assert not blockwise_scaled_mm_fits(w.cpu(), (128, 128))


@pytest.mark.parametrize("gemm", ["triton", "cublas"])
def test_block_gemms_replay_in_a_cuda_graph(gemm: str) -> None:
    """Captured with x quantized in the graph; replayed on new x, it gives a new product."""
    if gemm == "cublas":
        _needs_cublas_blockwise()
    _needs_fp8()
    x = torch.randn(96, 4096, device="cuda", dtype=torch.bfloat16)
    _, _, w, ws = _block_gemm_inputs(96, 1024, 4096)

    def step() -> torch.Tensor:
        xq, xs = quantize_fp8(x, 128)
        if gemm == "cublas":
            return blockwise_scaled_mm(xq, xs, w, ws, torch.bfloat16)
        return fp8_block_gemm(xq, xs, w, ws, (128, 128), torch.bfloat16)

    eager = step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.testing.assert_close(captured, step())
    assert not torch.equal(captured, eager)


@pytest.mark.parametrize(("m", "least"), [(65, "1"), (300, "1"), (65, "128"), (300, "128")])
def test_the_block_fp8_method_takes_cublas_from_the_setting_rows(m: int, least: str) -> None:
    """Past the tensor-core kernel's 64 rows a 128 x 128 block layer runs cuBLASLt's GEMM on
    steps of at least ``KVSERVE_FP8_BLOCK_CUBLAS_ROWS`` tokens, the Triton block GEMM on the
    others and with the setting at 0: each its own bits."""
    _needs_cublas_blockwise()
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    w, ws = quantize_weight(torch.randn(1024, 4096, device="cuda") * 0.02, "block", (128, 128))
    layer = SimpleNamespace(weight=w, weight_scale=ws, launch_pdl=False, in_features=4096,
                            out_features=1024)  # fmt: skip
    method = Fp8LinearMethod(Fp8Spec("block", "group", (128, 128)))
    xq, xs = quantize_fp8(x, 128)
    cublas = m >= int(least)
    with cached_setting(BLOCK_CUBLAS_ROWS_ENV, least, block_cublas_min_rows):
        on = method.apply(layer, x, None)  # type: ignore[arg-type]
        scheme = method.fp8_input_scheme(layer, x)  # type: ignore[arg-type]
        # what the norm writes for it: the same values, the scales M-major for cuBLAS
        mq, m_scales = quantize_fp8(x, scheme.group, scales_m_major=scheme.scales_m_major)
        taken = method.apply_fp8(layer, Fp8Activation(mq, m_scales, x.dtype), None)  # type: ignore[arg-type]
    with cached_setting(BLOCK_CUBLAS_ROWS_ENV, "0", block_cublas_min_rows):
        off = method.apply(layer, x, None)  # type: ignore[arg-type]
        assert not method.fp8_input_scheme(layer, x).scales_m_major  # type: ignore[arg-type, union-attr]
    assert scheme.scales_m_major == cublas
    assert m_scales.stride() == ((1, m) if cublas else (32, 1))
    triton = fp8_block_gemm(xq, xs, w, ws, (128, 128), torch.bfloat16)
    expected = blockwise_scaled_mm(xq, xs, w, ws, torch.bfloat16) if cublas else triton
    assert torch.equal(on, expected)
    assert torch.equal(taken, on)
    assert torch.equal(off, triton)
