"""The word GEMV with RMSNorm as its prologue (``gemv_norm.RowNorm``) against the norm's
reference followed by the same GEMV without it: FP8 per-channel and 128 x 128 blocks, NVFP4,
16-bit weights; 1-4 rows; with and without the residual add; split and unsplit K; gated. The
residual out must be x + residual exactly, the residual itself untouched.

``KVSERVE_TEST_DEVICE=cpu TRITON_INTERPRET=1 pytest --noconftest tests/gpu/test_gemv_norm.py``
runs them through Triton's interpreter on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

pytest.importorskip("triton")

from kernel_test_device import BF16_UNLESS_INTERPRETED, DEVICE, NEEDS_CUDA_GRAPHS  # noqa: E402
from test_fp4_gemm import fp4_weight  # noqa: E402

from kvserve.kernels.fp4_gemm import fp4_linear  # noqa: E402
from kvserve.kernels.gemv_norm import RowNorm, row_norm_reference  # noqa: E402
from kvserve.kernels.word_gemv import GemvConfig, fp8_gemv, half_gemv  # noqa: E402
from kvserve.quant.fp8_weights import quantize_weight  # noqa: E402

pytestmark = pytest.mark.gpu
N, K = 256, 512
# the unsplit and a split K, each with 128 words a program row (FP8: 512 values)
CONFIGS = [GemvConfig(block_n=64, block_w=32, split_k=1), GemvConfig(block_n=64, block_w=32,
                                                                    split_k=4)]  # fmt: skip
Gemv = Callable[..., torch.Tensor]


def _gemv(fmt: str, n: int, k: int, dtype: torch.dtype) -> Gemv:
    """fmt's GEMV over a random weight: (x, config, gated, norm) -> out."""
    gen = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=gen) / k**0.5
    if fmt == "bf16":
        w16 = w.to(dtype).to(DEVICE)
        return lambda x, cfg, gated, norm: half_gemv(x, w16, config=cfg, gated=gated, norm=norm)
    if fmt == "nvfp4":
        packed, block, row = fp4_weight("nvfp4", n, k)
        return lambda x, cfg, gated, norm: fp4_linear(
            x, packed, block, row, config=cfg, gated=gated, norm=norm
        )
    block = (64, 128) if fmt == "fp8_block" else None
    q, scale = quantize_weight(w, "block" if block else "channel", block)
    q, scale = q.to(DEVICE), scale.to(DEVICE)
    return lambda x, cfg, gated, norm: fp8_gemv(
        x, q, scale, config=cfg, block=block, gated=gated, norm=norm
    )


def _rows(m: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(m, k, generator=gen) * 3).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, BF16_UNLESS_INTERPRETED])
@pytest.mark.parametrize("fmt", ["fp8", "fp8_block", "nvfp4", "bf16"])
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("residual", [True, False], ids=["add", "plain"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=["unsplit", "split"])
def test_normed_gemv_matches_norm_then_gemv(
    dtype: torch.dtype, fmt: str, rows: int, residual: bool, cfg: GemvConfig
) -> None:
    if fmt == "bf16" and dtype == torch.float32:
        pytest.skip("16-bit weights take 16-bit x")
    gemv = _gemv(fmt, N, K, torch.float16 if dtype == torch.float32 else dtype)
    x, r = _rows(rows, K, dtype, 1), _rows(rows, K, dtype, 2)
    weight = (1 + 0.1 * _rows(1, K, torch.float32, 3)[0]).to(dtype)
    kept = r.clone()
    norm = RowNorm(weight, 1e-6, r if residual else None, torch.empty_like(x) if residual else None)
    got = gemv(x, cfg, False, norm)
    ref_norm = RowNorm(weight, 1e-6, r.clone(), torch.empty_like(x)) if residual else norm
    want = gemv(row_norm_reference(x, ref_norm), cfg, False, None)
    err = (got.float() - want.float()).abs().max() / want.float().abs().max()
    assert err < (1e-5 if dtype == torch.float32 else 2e-2), f"relative error {err:.3g}"
    if residual:
        assert torch.equal(norm.residual_out, x + kept)
        assert torch.equal(r, kept)


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_normed_gated_gemv_matches_norm_then_gated_gemv(fmt: str) -> None:
    dtype = torch.float16
    gemv = _gemv(fmt, N, K, dtype)
    x, r = _rows(2, K, dtype, 4), _rows(2, K, dtype, 5)
    weight = torch.full((K,), 0.7, dtype=dtype, device=DEVICE)
    norm = RowNorm(weight, 1e-5, r.clone(), torch.empty_like(x))
    got = gemv(x, CONFIGS[1], True, norm)
    want = gemv(row_norm_reference(x, RowNorm(weight, 1e-5, r, torch.empty_like(x))), CONFIGS[1],
                True, None)  # fmt: skip
    assert got.shape == (2, N // 2)
    err = (got.float() - want.float()).abs().max() / want.float().abs().max()
    assert err < 2e-2, f"relative error {err:.3g}"


def test_a_norm_that_does_not_fit_is_refused() -> None:
    gemv = _gemv("fp8", N, K, torch.float16)
    x = _rows(1, K, torch.float16, 6)
    with pytest.raises(ValueError, match="RowNorm does not fit"):
        gemv(x, CONFIGS[0], False, RowNorm(torch.ones(K // 2, device=DEVICE), 1e-6))
    with pytest.raises(ValueError, match="RowNorm does not fit"):  # a residual needs its out
        gemv(x, CONFIGS[0], False, RowNorm(torch.ones(K, device=DEVICE), 1e-6, x.clone()))


@NEEDS_CUDA_GRAPHS
def test_normed_gemv_replays_in_a_cuda_graph() -> None:
    """Captured, then replayed on new rows: the scratch row and the
    residual out are rewritten each replay."""
    dtype = torch.bfloat16
    gemv = _gemv("fp8", 4096, 4096, dtype)
    x, r = _rows(1, 4096, dtype, 7), _rows(1, 4096, dtype, 8)
    weight = torch.ones(4096, dtype=dtype, device=DEVICE)
    out_r = torch.empty_like(x)
    norm = RowNorm(weight, 1e-6, r, out_r)
    gemv(x, None, False, norm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = gemv(x, None, False, norm)
    x.copy_(_rows(1, 4096, dtype, 9))
    graph.replay()
    want = gemv(row_norm_reference(x, RowNorm(weight, 1e-6, r, torch.empty_like(x))), None, False,
                None)  # fmt: skip
    assert torch.equal(out_r, x + r)
    err = (got.float() - want.float()).abs().max() / want.float().abs().max()
    assert err < 2e-2, f"relative error {err:.3g}"
