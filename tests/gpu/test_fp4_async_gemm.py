"""The asynchronous-MMA FP4 GEMM (``fp4_async_gemm.py``, Gluon, Hopper) against the torch
reference: rows 1..128 below, at and above an x tile, N past the W tile, K of one to 32 steps,
split K (odd step counts a split: the kernel's two-step and four-step tails), bias and row
scales, MXFP4 scales across their range, CUDA graph replay. Needs an sm_90 GPU (no interpreter:
Gluon)."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("triton")

from kernel_test_device import DEVICE  # noqa: E402
from test_fp4_gemm import activations, check, fp4_weight  # noqa: E402

from kvserve.kernels.fp4_async_decode import max_e8m0  # noqa: E402
from kvserve.kernels.fp4_async_gemm import (  # noqa: E402
    HAS_GLUON,
    fp4_async_linear,
    ring_fits,
)
from kvserve.kernels.fp4_tile import block_m_for  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (
            HAS_GLUON
            and DEVICE.type == "cuda"
            and torch.cuda.is_available()
            and torch.cuda.get_device_capability()[0] == 9
        ),
        reason="Gluon's wgmma kernel needs a Hopper GPU",
    ),  # fmt: skip
]

FORMATS = ["nvfp4", "mxfp4"]
# (N, K): N a multiple of the 128-row W tile or not; K of 1, 3, 9 and 32 steps of 128
SHAPES = [(256, 128), (200, 384), (72, 1152), (1000, 4096)]


@pytest.mark.parametrize(("warps", "stages"), [(8, 4), (4, 5), (8, 6)])
@pytest.mark.parametrize("split_k", [1, 2, 3])
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("m", [1, 5, 16, 33, 64, 100, 128])
@pytest.mark.parametrize("fmt", FORMATS)
def test_matches_reference(
    fmt: str, m: int, n: int, k: int, split_k: int, warps: int, stages: int
) -> None:
    weight = fp4_weight(fmt, n, k)
    bias = torch.linspace(-1, 1, n, device=DEVICE).to(torch.bfloat16)
    x = activations(m, k, torch.bfloat16)
    if not ring_fits(block_m_for(m), warps, stages):
        # six slots of a 128-row x tile: 240 KiB, past sm_90's 227
        with pytest.raises(ValueError, match="shared memory"):
            fp4_async_linear(x, *weight, bias, split_k=split_k, num_warps=warps, stages=stages)
        return
    out = fp4_async_linear(x, *weight, bias, split_k=split_k, num_warps=warps, stages=stages)
    check(out, x, weight, bias)


@pytest.mark.parametrize(("bits", "max_registers"), [(True, None), (False, 128), (True, 128)])
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("m", [5, 33, 64])
@pytest.mark.parametrize("fmt", FORMATS)
def test_other_decode_and_register_cap_match_reference(
    fmt: str, m: int, n: int, k: int, split_k: int, bits: bool, max_registers: int | None
) -> None:
    """``bits=True``: codes decoded by placing their bits (subnormal bf16 for 0.5, which the
    bf16 multiply must keep), x in the permutation that pairs codes j and j + 4;
    ``max_registers=128``: two programs an SM."""
    weight = fp4_weight(fmt, n, k)
    bias = torch.linspace(-1, 1, n, device=DEVICE).to(torch.bfloat16)
    x = activations(m, k, torch.bfloat16)
    out = fp4_async_linear(
        x, *weight, bias, split_k=split_k, bits=bits, max_registers=max_registers
    )
    check(out, x, weight, bias)


@pytest.mark.parametrize("bits", [False, True])
@pytest.mark.parametrize("exponent", [0, 60, 127, None])
def test_mxfp4_scales_across_their_range(exponent: int | None, bits: bool) -> None:
    """E8M0 exponents from the smallest to the largest the decode takes (None): 2**-127 ..
    2**9 (e4m3 trick), 2**1 (bit placement)."""
    exponent = max_e8m0(bits) if exponent is None else exponent
    n, k = 128, 256
    packed, _, _ = fp4_weight("mxfp4", n, k)
    scales = torch.full((n, k // 32), exponent, dtype=torch.uint8, device=DEVICE)
    x = activations(16, k, torch.bfloat16) * 2.0 ** (120 - exponent)
    check(fp4_async_linear(x, packed, scales, bits=bits), x, (packed, scales, None))


def test_replays_in_a_cuda_graph_with_split_k() -> None:
    """The split counters reset themselves: every replay sums its splits afresh."""
    n, k = 1000, 4096
    weight = fp4_weight("nvfp4", n, k)
    x = activations(64, k, torch.bfloat16)
    out = fp4_async_linear(x, *weight, split_k=4)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp4_async_linear(x, *weight, split_k=4)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        check(out, x, weight)


@pytest.mark.parametrize(("mode", "wide", "taken"),
                         [("1", False, [17, 64, 128]), ("auto", False, []),
                          ("auto", True, [17, 64, 128]), ("0", True, [])])  # fmt: skip
@pytest.mark.parametrize("fmt", FORMATS)
def test_fp4_linear_takes_it_by_the_setting(
    fmt: str, mode: str, wide: bool, taken: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``KVSERVE_FP4_ASYNC`` and a weight found to fit at load: fp4_linear's default is this
    kernel at 17-128 rows (same result as the reference) for every weight (``1``), for one whose
    W tiles fill 70% of the SMs (``auto``: ``wide``), and never for a weight not vouched for."""
    from kvserve.kernels import fp4_async_choice, fp4_gemm
    from kvserve.kernels._triton import sm_count
    from kvserve.kernels.fp4_gemm import fp4_linear

    monkeypatch.setenv(fp4_async_choice.ASYNC_ENV, mode)
    fp4_async_choice.async_gemm_mode.cache_clear()
    calls = []

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(args[0].shape[0])
        return fp4_async_linear(*args, **kwargs)

    monkeypatch.setattr(fp4_gemm, "fp4_async_linear", counted)
    n = 128 * math.ceil(0.7 * sm_count(DEVICE)) if wide else 512
    weight = fp4_weight(fmt, n, 256)
    for m in (16, 17, 64, 128, 129):
        x = activations(m, 256, torch.bfloat16)
        check(fp4_linear(x, *weight, async_weight=True), x, weight)
        check(fp4_linear(x, *weight), x, weight)
    fp4_async_choice.async_gemm_mode.cache_clear()
    assert calls == taken


@pytest.mark.parametrize("m", [16, 64])
@pytest.mark.parametrize("fmt", FORMATS)
def test_dependent_launches_in_a_graph_read_what_the_kernel_before_wrote(
    fmt: str, m: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pdl=True`` in a CUDA graph, as the engine launches them: an RMSNorm writes x, the FP4
    kernels read it (16 rows: the Triton MMA kernel; 64: x's permutation, then the async GEMM
    split over K) and another RMSNorm reads their output, every launch dependent on the one
    before. Each replay takes new input: every result is that input's, so no kernel read
    before the one before it had written."""
    from kvserve.kernels import fp4_async_choice
    from kvserve.kernels.fp4_gemm import fp4_linear
    from kvserve.kernels.rmsnorm import rms_norm

    monkeypatch.setenv(fp4_async_choice.ASYNC_ENV, "1")
    fp4_async_choice.async_gemm_mode.cache_clear()
    n, k = 1000, 4096
    weight = fp4_weight(fmt, n, k)
    norm_k = torch.ones(k, dtype=torch.bfloat16, device=DEVICE)
    norm_n = torch.ones(n, dtype=torch.bfloat16, device=DEVICE)
    source = activations(m, k, torch.bfloat16)

    def chain() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = rms_norm(source, norm_k, 1e-6, pdl=True)
        y = fp4_linear(x, *weight, pdl=True, async_weight=True)
        return x, y, rms_norm(y, norm_n, 1e-6, pdl=True)

    chain()  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x, y, z = chain()
    for seed in range(4):
        fresh = torch.randn(m, k, generator=torch.Generator().manual_seed(seed))
        source.copy_(fresh.to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        expected_x = rms_norm(source, norm_k, 1e-6)
        assert torch.equal(x, expected_x)
        check(y, x, weight)
        assert torch.equal(z, rms_norm(y, norm_n, 1e-6))
