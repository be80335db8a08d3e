"""Weight-only FP8 on the skinny GEMM kernel (``skinny_linear_fp8``) against
``x.float() @ (w.float() * scale).T``: per-row and per-tensor scales, row counts below, at and
above a tile, N and K tails, split-K; and the FP8 linear method's decode path on it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

from kernel_test_device import DEVICE, INTERPRETED  # noqa: E402

from kvserve.kernels.skinny_gemm import (  # noqa: E402
    SkinnyGemmConfig,
    block_m_for,
    skinny_linear_fp8,
)
from kvserve.quant.fp8_config import Fp8Spec  # noqa: E402
from kvserve.quant.fp8_method import W8A16_ROWS_ENV, Fp8LinearMethod, w8a16_max_rows  # noqa: E402
from kvserve.quant.fp8_weights import quantize_weight  # noqa: E402

pytestmark = pytest.mark.gpu
ON_GPU_ONLY = pytest.mark.skipif(INTERPRETED, reason="too slow in Triton's interpreter")
X_DTYPE = torch.float16 if INTERPRETED else torch.bfloat16  # the interpreter has no bf16 MMA
ROWS = [1, 3, 16, 33, 64]
# N and K tails; a Llama-3-8B qkv
SHAPES = [(256, 512), (200, 300), pytest.param(6144, 4096, marks=ON_GPU_ONLY)]


def inputs(m: int, n: int, k: int, per_row: bool) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(m * 7919 + n + k)
    x = torch.randn(m, k, generator=gen).to(X_DTYPE)
    w = torch.randn(n, k, generator=gen) / k**0.5
    q, scale = quantize_weight(w, "channel" if per_row else "tensor")
    return x.to(DEVICE), q.to(DEVICE), scale.to(DEVICE)


def check(out: torch.Tensor, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> None:
    w = q.float() * (scale.reshape(-1, 1) if scale.numel() > 1 else scale)
    ref = x.float() @ w.T
    assert out.shape == ref.shape and out.dtype == x.dtype
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)  # bf16 output rounding


@pytest.mark.parametrize("per_row", [True, False])
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("m", ROWS)
def test_matches_reference(m: int, n: int, k: int, split_k: int, per_row: bool) -> None:
    x, q, scale = inputs(m, n, k, per_row)
    cfg = SkinnyGemmConfig(64, 64, block_m_for(m), split_k, 4, 3)
    check(skinny_linear_fp8(x, q, scale, cfg), x, q, scale)


@ON_GPU_ONLY
@pytest.mark.parametrize("m", [1, 16])
def test_default_config(m: int) -> None:
    x, q, scale = inputs(m, 4096, 14336, True)
    check(skinny_linear_fp8(x, q, scale), x, q, scale)


def test_bad_operands_are_refused() -> None:
    x, q, scale = inputs(2, 128, 256, True)
    with pytest.raises(ValueError, match="skinny_linear_fp8"):
        skinny_linear_fp8(x.float(), q, scale)
    with pytest.raises(ValueError, match="skinny_linear_fp8"):
        skinny_linear_fp8(x, q.to(torch.bfloat16), scale)
    with pytest.raises(ValueError, match="skinny_linear_fp8"):
        skinny_linear_fp8(x, q, scale[:3])


@pytest.mark.skipif(DEVICE.type != "cuda", reason="CUDA graphs need a GPU")
def test_split_k_replays_in_cuda_graph() -> None:
    x, q, scale = inputs(1, 4096, 4096, True)
    cfg = SkinnyGemmConfig(64, 128, 16, 4, 4, 4)
    expected = skinny_linear_fp8(x, q, scale, cfg)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = skinny_linear_fp8(x, q, scale, cfg)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected)


@pytest.mark.skipif(DEVICE.type != "cuda", reason="the method takes this path on CUDA only")
@pytest.mark.parametrize("spec", [Fp8Spec("channel", "token"), Fp8Spec("tensor", "static")])
def test_fp8_method_runs_small_steps_weight_only(
    spec: Fp8Spec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With KVSERVE_FP8_W8A16_ROWS=4, steps of up to 4 rows run on the GEMV and skip the
    activation quantization (exact to the dequantized weight); the W8A8 path stays within its
    activation rounding."""
    x, q, scale = inputs(4, 512, 1024, spec.weight == "channel")
    layer = SimpleNamespace(weight=q, weight_scale=scale,
                            input_scale=torch.full((1,), 0.02, device=DEVICE))  # fmt: skip
    method = Fp8LinearMethod(spec)
    monkeypatch.setenv(W8A16_ROWS_ENV, "0")
    w8a16_max_rows.cache_clear()
    w8a8 = method._matmul(layer, x)  # type: ignore[arg-type]
    monkeypatch.setenv(W8A16_ROWS_ENV, "4")
    w8a16_max_rows.cache_clear()
    try:
        out = method._matmul(layer, x)  # type: ignore[arg-type]
    finally:
        monkeypatch.delenv(W8A16_ROWS_ENV)
        w8a16_max_rows.cache_clear()
    check(out, x, q, scale)
    torch.testing.assert_close(out.float(), w8a8.float(), atol=0.1, rtol=0.1)
