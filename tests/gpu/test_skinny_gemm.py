"""The skinny (decode-shaped) GEMM kernel against ``x.float() @ w.float().T``: row counts below,
at and above a tile, N and K tails, split-K with both reductions, and the config helpers.

``KVSERVE_TEST_DEVICE=cpu TRITON_INTERPRET=1 pytest --noconftest`` runs these through Triton's
interpreter on a CPU (bf16 and the Llama-sized shapes are skipped there).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from kernel_test_device import BF16_UNLESS_INTERPRETED, DEVICE, NEEDS_CUDA_GRAPHS, ON_GPU_ONLY  # noqa: E402

from kvserve.env_settings import check_environment  # noqa: E402
from kvserve.errors import ConfigError  # noqa: E402
from kvserve.kernels import skinny_gemm  # noqa: E402
from kvserve.kernels._triton import hopper_or_newer  # noqa: E402
from kvserve.kernels.skinny_gemm import (  # noqa: E402
    SkinnyGemmConfig,
    block_m_for,
    candidate_configs,
    default_config,
    skinny_linear,
)
from kvserve.quant.unquantized import SKINNY_ROWS_ENV, make_method, skinny_max_rows  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = [BF16_UNLESS_INTERPRETED, torch.float32]
# bf16: the output's rounding (values of order 1); fp32: summation order over K <= 14336.
TOL = {torch.bfloat16: 2e-2, torch.float32: 1e-4}
ROWS = [1, 3, 16, 33, 64]
# (N, K): N not a multiple of the tile, K not a multiple of BLOCK_K (300), several K tiles
SMALL_SHAPES = [(256, 512), (200, 300), (384, 1024)]
LLAMA_SHAPES = [
    pytest.param(6144, 4096, marks=ON_GPU_ONLY),
    pytest.param(4096, 14336, marks=ON_GPU_ONLY),
]


def inputs(m: int, n: int, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(m * 7919 + n + k)
    x = torch.randn(m, k, generator=gen)
    w = torch.randn(n, k, generator=gen) / k**0.5  # outputs of order 1
    return x.to(dtype).to(DEVICE), w.to(dtype).to(DEVICE)


def check(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    ref = x.float() @ w.float().T
    assert out.shape == ref.shape and out.dtype == x.dtype
    tol = TOL[x.dtype]
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


def small_config(m: int, split_k: int, **kw: object) -> SkinnyGemmConfig:
    return SkinnyGemmConfig(64, 64, block_m_for(m), split_k, 4, 3, **kw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize(("n", "k"), SMALL_SHAPES)
@pytest.mark.parametrize("m", ROWS)
def test_matches_reference(m: int, n: int, k: int, split_k: int, dtype: torch.dtype) -> None:
    x, w = inputs(m, n, k, dtype)
    check(skinny_linear(x, w, small_config(m, split_k)), x, w)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "k"), [*SMALL_SHAPES, *LLAMA_SHAPES])
@pytest.mark.parametrize("m", [1, 33, 64])
def test_default_config(m: int, n: int, k: int, dtype: torch.dtype) -> None:
    x, w = inputs(m, n, k, dtype)
    check(skinny_linear(x, w), x, w)


def test_split_k_is_deterministic_and_leaves_counters_at_zero() -> None:
    """Whichever split arrives last sums the partials in split order: repeats are bit-equal."""
    m, n, k = 5, 320, 1024
    x, w = inputs(m, n, k, torch.float32)
    cfg = small_config(m, 4)
    first = skinny_linear(x, w, cfg)
    for _ in range(3):
        assert torch.equal(skinny_linear(x, w, cfg), first)
    assert int(skinny_gemm._COUNTERS[x.device].abs().sum()) == 0
    check(first, x, w)


def test_more_splits_than_k_tiles_and_rows_over_a_tile() -> None:
    x, w = inputs(70, 100, 128, torch.float32)  # 5 row tiles of 16; 2 K tiles for 8 splits
    check(skinny_linear(x, w, small_config(16, 8)), x, w)


def test_fallbacks_to_f_linear() -> None:
    x, w = inputs(65, 128, 64, torch.float32)  # more rows than MAX_ROWS, no config
    assert torch.equal(skinny_linear(x, w), F.linear(x, w))
    wt = w.t().contiguous().t()  # K not contiguous
    assert torch.equal(skinny_linear(x[:3], wt), F.linear(x[:3], wt))
    assert skinny_linear(x[:0], w).shape == (0, 128)


@pytest.mark.parametrize("split_k", [1, 3])
def test_bias_is_added_once(split_k: int) -> None:
    """With split K the bias joins the in-order sum's epilogue, not every split's partial."""
    x, w = inputs(5, 200, 384, torch.float32)
    bias = torch.linspace(-1, 1, 200, device=DEVICE)
    out = skinny_linear(x, w, small_config(5, split_k), bias)
    torch.testing.assert_close(out, x @ w.T + bias, atol=1e-4, rtol=1e-4)


def test_unquantized_method_takes_the_kernel_up_to_its_row_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``KVSERVE_BF16_SKINNY_ROWS`` bounds the steps that take the kernel on sm_90+ (CUDA-only:
    elsewhere the method keeps F.linear); a bad value is refused."""
    x, w = inputs(4, 256, 512, torch.float32)
    layer = SimpleNamespace(weight=w, launch_pdl=False)
    monkeypatch.setenv(SKINNY_ROWS_ENV, "65")
    skinny_max_rows.cache_clear()
    with pytest.raises(ConfigError, match="from 0 to 64"):
        check_environment()  # what an engine runs first
    monkeypatch.setenv(SKINNY_ROWS_ENV, "4")
    skinny_max_rows.cache_clear()
    try:
        method = make_method(None)
        out = method.apply(layer, x, None)  # type: ignore[arg-type]
        check(out, x, w)
        if x.is_cuda and hopper_or_newer(x.device):
            assert torch.equal(out, skinny_linear(x, w))
            assert torch.equal(method.apply(layer, x[:0], None), F.linear(x[:0], w))  # type: ignore[arg-type]
        assert torch.equal(
            method.apply(layer, torch.cat([x, x]), None), F.linear(torch.cat([x, x]), w)
        )  # type: ignore[arg-type]
    finally:
        monkeypatch.delenv(SKINNY_ROWS_ENV)
        skinny_max_rows.cache_clear()


def test_strided_rows_of_x() -> None:
    x, w = inputs(9, 192, 256, torch.float32)
    wide = torch.zeros(9, 384, device=DEVICE)
    wide[:, :256] = x
    check(skinny_linear(wide[:, :256], w, small_config(9, 2)), x, w)


@pytest.mark.parametrize(
    ("n", "k"), [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]
)
@pytest.mark.parametrize("m", [1, 16, 64])
def test_candidate_configs_fill_the_sms(m: int, n: int, k: int) -> None:
    configs = candidate_configs(m, n, k, num_sms=132)
    assert configs[0] == default_config(m, n, k, num_sms=132)
    assert 4 <= len(configs) <= 20 and len(set(configs)) == len(configs)
    for cfg in configs:
        assert cfg.block_m == block_m_for(m) and cfg.block_n in (64, 128)
        programs = -(-m // cfg.block_m) * -(-n // cfg.block_n) * cfg.split_k
        assert programs >= 0.9 * 132 and (cfg.split_k == 1 or programs <= 4 * 132)
        assert 3 <= cfg.num_stages <= 5
        assert cfg.num_stages * (cfg.block_n + cfg.block_m) * cfg.block_k * 2 <= 200 * 1024


@ON_GPU_ONLY
@pytest.mark.parametrize("m", [1, 33])
def test_every_candidate_config_on_a_llama_shape(m: int) -> None:
    x, w = inputs(m, 4096, 4096, torch.bfloat16)
    for cfg in candidate_configs(m, 4096, 4096, num_sms=132):
        check(skinny_linear(x, w, cfg), x, w)


@NEEDS_CUDA_GRAPHS
def test_split_k_replays_in_cuda_graph() -> None:
    """The arrival counters are reset by each launch, so replays of a graph stay correct."""
    x, w = inputs(16, 4096, 4096, torch.bfloat16)
    cfg = SkinnyGemmConfig(64, 128, 16, 4, 4, 4)
    expected = skinny_linear(x, w, cfg)  # also compiles and allocates the counters
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = skinny_linear(x, w, cfg)
    for _ in range(5):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected)
    check(out, x, w)
