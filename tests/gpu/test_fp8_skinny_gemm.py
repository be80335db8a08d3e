"""The swap-AB FP8 tensor-core kernel (``fp8_skinny_linear``) against its reference (x quantized
per row and 128-column group, then fp32 math) and against the unquantized product: 1-64 rows,
per-row and per-tensor scales, N and K tails, split K, bias, zero rows, CUDA graph replay; and
the FP8 linear method's decode path on it.

``KVSERVE_TEST_DEVICE=cpu TRITON_INTERPRET=1 pytest --noconftest tests/gpu/test_fp8_skinny_gemm.py``
runs them through Triton's interpreter on a CPU (with the dot in fp32 on e4m3 values, as the
kernel does there).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

from kernel_test_device import DEVICE, INTERPRETED, NEEDS_CUDA_GRAPHS, ON_GPU_ONLY  # noqa: E402

from kvserve.errors import ConfigError  # noqa: E402
from kvserve.kernels import skinny_gemm  # noqa: E402
from kvserve.kernels._triton import sm_count  # noqa: E402
from kvserve.kernels.activation import silu_and_mul  # noqa: E402
from kvserve.kernels.fp8_gemm import dequantize_fp8_weight  # noqa: E402
from kvserve.kernels.fp8_quant import quantize_fp8  # noqa: E402
from kvserve.kernels.fp8_skinny_gemm import (  # noqa: E402
    PREFETCH_ENV,
    QUANTIZE_FIRST_ABOVE,
    Fp8SkinnyConfig,
    chains_mmas,
    fp8_skinny_config,
    fp8_skinny_linear,
    fp8_skinny_reference,
    skinny_prefetch_steps,
)
from kvserve.quant.fp8_activation import Fp8Activation  # noqa: E402
from kvserve.quant.fp8_config import Fp8Spec  # noqa: E402
from kvserve.quant.fp8_method import (  # noqa: E402
    SILU_QUANT_ENV,
    SKINNY_ROW_SCALE_ENV,
    SKINNY_ROWS_ENV,
    W8A16_ROWS_ENV,
    Fp8LinearMethod,
    silu_quant_enabled,
    skinny_max_rows,
    skinny_row_scale,
    skinny_row_scale_enabled,
    w8a16_max_rows,
)
from kvserve.quant.fp8_weights import quantize_weight  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1] / "quant"))
from fp8_helpers import cached_setting  # noqa: E402

pytestmark = pytest.mark.gpu
X_DTYPES = [torch.float16] if INTERPRETED else [torch.bfloat16, torch.float16]
# K a multiple of the 128-column step or not (300); N tails (200)
SHAPES = [(256, 512), (200, 300), pytest.param(6144, 4096, marks=ON_GPU_ONLY)]
# The reference quantizes x with the same scales; they differ by the order of fp32 sums, and by
# a rounding step of x where the kernel's product with 1 / scale and the reference's division
# (fp8_quant's) land on either side of a tie.
REF_TOL = 1e-2
EXACT_TOL = 6e-2  # against x @ W in fp32: e4m3 activations, 3 mantissa bits


# the FP8 method's schemes with a per-token, static or per-group x scale
METHOD_SPECS = [
    Fp8Spec("channel", "token"),
    Fp8Spec("tensor", "static"),
    Fp8Spec("block", "group", (128, 128)),
]


def method_layer(q: torch.Tensor, scale: torch.Tensor) -> SimpleNamespace:
    """The attributes of a Linear that ``Fp8LinearMethod`` reads."""
    return SimpleNamespace(weight=q, weight_scale=scale, launch_pdl=False,
                           input_scale=torch.full((1,), 0.02, device=DEVICE))  # fmt: skip


def inputs(
    m: int, n: int, k: int, per_row: bool, dtype: torch.dtype, block: tuple[int, int] | None = None
) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(m * 7919 + n + k)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = torch.randn(n, k, generator=gen) / k**0.5
    if block is not None:  # rows of blocks at different scales, so a wrong block shows
        w = w * torch.linspace(0.2, 3.0, -(-n // block[0])).repeat_interleave(block[0])[:n, None]
    q, scale = quantize_weight(w, "block" if block else "channel" if per_row else "tensor", block)
    return x.to(DEVICE), q.to(DEVICE), scale.to(DEVICE)


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).abs().max() / ref.float().abs().max())


def check(
    out: torch.Tensor,
    x: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    block: tuple[int, int] | None = None,
) -> None:
    exact = x.float() @ dequantize_fp8_weight(q, scale, block).T
    if bias is not None:
        exact = exact + bias.float()
    assert out.dtype == x.dtype and out.shape == exact.shape
    assert rel(out, fp8_skinny_reference(x, q, scale, bias, block=block)) < REF_TOL
    assert rel(out, exact) < EXACT_TOL


@pytest.mark.parametrize("quantize_first", [False, True])
@pytest.mark.parametrize("dtype", X_DTYPES)
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("per_row", [True, False])
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("m", [1, 5, 16, 33, 64])
def test_matches_reference(
    m: int,
    n: int,
    k: int,
    per_row: bool,
    split_k: int,
    dtype,
    quantize_first: bool,  # noqa: ANN001
) -> None:
    """x quantized in the loop or (quantize_first, where K divides into groups) before it."""
    x, q, scale = inputs(m, n, k, per_row, dtype)
    block_m = max(16, 1 << (m - 1).bit_length())
    cfg = Fp8SkinnyConfig(64, 128, block_m, split_k, 4, 2, quantize_first)
    check(fp8_skinny_linear(x, q, scale, config=cfg), x, q, scale)


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("block", [None, (128, 128)])
def test_rows_past_one_tile(block: tuple[int, int] | None, split_k: int) -> None:
    """Past 64 rows (``KVSERVE_FP8_SKINNY_ROWS`` up to 512) x runs in tiles of 64 rows, the last
    one short, each with its own x scales; the default config quantizes x first."""
    m, n, k = 130, 256, 512
    x, q, scale = inputs(m, n, k, True, X_DTYPES[-1], block)
    cfg = fp8_skinny_config(m, n, k, num_sms=132)
    assert (cfg.block_m, cfg.quantize_first) == (64, True)
    cfg = Fp8SkinnyConfig(128, 128, 64, split_k, 4, 2, True)
    out = fp8_skinny_linear(x, q, scale, config=cfg, block=block)
    check(out, x, q, scale, block=block)
    tile = slice(64, 128)  # a middle tile alone gives the same rows
    assert torch.equal(out[tile], fp8_skinny_linear(x[tile], q, scale, config=cfg, block=block))


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("per_row", [True, False])
@pytest.mark.parametrize("m", [40, 130])
def test_one_x_scale_a_row_chains_the_k_loop(m: int, per_row: bool, split_k: int) -> None:
    """``x_row_scale``: x quantized first with one scale a row (per token) for per-channel or
    per-tensor W: the reference quantizing x per row, and the same bits from an x the caller
    quantized so (``x_scales [M, 1]``, as the norm writes it for such a step)."""
    n, k = 256, 512
    x, q, scale = inputs(m, n, k, per_row, X_DTYPES[-1])
    cfg = Fp8SkinnyConfig(128, 128, 64, split_k, 4, 2, True)
    out = fp8_skinny_linear(x, q, scale, config=cfg, x_row_scale=True)
    assert rel(out, fp8_skinny_reference(x, q, scale, group=k)) < REF_TOL
    assert rel(out, x.float() @ dequantize_fp8_weight(q, scale).T) < EXACT_TOL
    xq, xs = quantize_fp8(x, None)
    assert xs.shape == (m, 1)
    given = fp8_skinny_linear(xq, q, scale, config=cfg, x_scales=xs, out_dtype=x.dtype)
    assert torch.equal(given, out)


@pytest.mark.parametrize("prefetch", [0, 4])
@pytest.mark.parametrize("per_row", [True, False])
@pytest.mark.parametrize(("m", "n"), [(40, 256), (64, 200), (33, 384)])
def test_the_chained_loop_takes_its_own_tiling_past_32_rows(
    m: int, n: int, per_row: bool, prefetch: int
) -> None:
    """x quantized first with a scale a row, W without blocks (``chained``): 64-row W tiles with
    K split to one program an SM and 8 stages, where such tiles fit one an SM, whether x comes
    16-bit or quantized by the caller; W's first K steps asked of L2 before the wait
    (``KVSERVE_FP8_SKINNY_PREFETCH``; not interpreted) change no bit."""
    k = 512
    x, q, scale = inputs(m, n, k, per_row, X_DTYPES[-1])
    sms = sm_count(DEVICE)
    tiling = fp8_skinny_config(m, n, k, num_sms=sms, chained=True)
    assert (tiling.block_n, tiling.num_stages) == (64, 8)
    out = fp8_skinny_linear(x, q, scale, x_row_scale=True)
    assert torch.equal(out, fp8_skinny_linear(x, q, scale, x_row_scale=True, config=tiling))
    assert rel(out, fp8_skinny_reference(x, q, scale, group=k)) < REF_TOL
    xq, xs = quantize_fp8(x, None)
    with cached_setting(PREFETCH_ENV, str(prefetch), skinny_prefetch_steps):
        given = fp8_skinny_linear(xq, q, scale, x_scales=xs, out_dtype=x.dtype)
        assert fp8_skinny_config(m, n, k, num_sms=sms, chained=True).prefetch_steps == prefetch
    assert torch.equal(given, out)


def test_only_the_chained_loop_is_retiled() -> None:
    """Past one program an SM of 64-row tiles (gate_up) a chained launch keeps the default
    tiling (with its L2 requests, four K steps by default); block-scaled W, x in 128-column
    groups, in-loop quantization (up to 32 rows) and a K that leaves x 16-bit keep the default
    tiling and make none."""
    default = fp8_skinny_config(64, 6144, 4096, num_sms=132)
    assert (default.block_n, default.split_k, default.num_stages) == (128, 2, 4)
    chained = fp8_skinny_config(64, 6144, 4096, num_sms=132, chained=True)
    assert (chained.block_n, chained.split_k, chained.num_stages) == (64, 1, 8)
    gate_up = fp8_skinny_config(64, 28672, 4096, num_sms=132, chained=True)
    assert gate_up == replace(fp8_skinny_config(64, 28672, 4096, num_sms=132), prefetch_steps=4)
    assert fp8_skinny_config(32, 6144, 4096, num_sms=132, chained=True) == fp8_skinny_config(
        32, 6144, 4096, num_sms=132
    )
    with cached_setting(PREFETCH_ENV, "4", skinny_prefetch_steps):
        assert fp8_skinny_config(64, 6144, 4096, num_sms=132).prefetch_steps == 0
        assert fp8_skinny_config(64, 6144, 4096, num_sms=132, chained=True).prefetch_steps == 4
    assert chains_mmas(None, True, None, 512) and chains_mmas(None, False, torch.ones(2, 1), 300)
    assert not chains_mmas(None, True, None, 300)  # x stays 16-bit: K is not whole K steps
    assert not chains_mmas((128, 128), True, None, 512) and not chains_mmas(None, False, None, 512)
    # K = 300 is not a whole number of quantization groups: x stays 16-bit, nothing chains
    for block, row_scale, k in (((128, 128), False, 512), (None, False, 512), (None, True, 300)):
        x, q, scale = inputs(40, 256, k, True, X_DTYPES[-1], block)
        out = fp8_skinny_linear(x, q, scale, block=block, x_row_scale=row_scale)
        want = fp8_skinny_config(40, 256, k, num_sms=sm_count(DEVICE))
        assert torch.equal(out, fp8_skinny_linear(x, q, scale, block=block, config=want))


def test_block_scaled_w_keeps_a_scale_a_k_step() -> None:
    """W's 128 x 128 blocks need each step scaled: ``x_row_scale`` leaves such a step as it
    is, and an x with one scale a row is refused."""
    block = (128, 128)
    x, q, scale = inputs(40, 256, 512, True, X_DTYPES[-1], block)
    cfg = Fp8SkinnyConfig(128, 128, 64, 1, 4, 2, True)
    out = fp8_skinny_linear(x, q, scale, config=cfg, block=block, x_row_scale=True)
    assert torch.equal(out, fp8_skinny_linear(x, q, scale, config=cfg, block=block))
    xq, xs = quantize_fp8(x, None)
    with pytest.raises(ValueError, match="a quantized x is e4m3"):
        fp8_skinny_linear(xq, q, scale, config=cfg, block=block, x_scales=xs)


@pytest.mark.parametrize("block_n", [64, 128])
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("m", [1, 20])
def test_block_scales(m: int, n: int, k: int, block_n: int) -> None:
    """Weights scaled per block of 128 x 128 (DeepSeek-V3 / Qwen3-FP8), tiles of 64 or 128 rows,
    split K; N and K tails cut blocks short."""
    block = (128, 128)
    x, q, scale = inputs(m, n, k, True, X_DTYPES[-1], block)
    cfg = Fp8SkinnyConfig(block_n, 128, 16 if m <= 16 else 32, 2, 4, 2)
    check(fp8_skinny_linear(x, q, scale, config=cfg, block=block), x, q, scale, block=block)


@pytest.mark.parametrize(
    ("m", "block_m", "split_k", "quantize_first"), [(1, 16, 4, False), (24, 32, 4, False),
                                                    (40, 64, 2, True)]
)  # fmt: skip
def test_default_config_bias_and_zero_rows(
    m: int, block_m: int, split_k: int, quantize_first: bool
) -> None:
    """A row of zeros (a padded batch slot) gives the bias, not NaN from 0 / 0; past 32 rows the
    default quantizes x first, at one program an SM."""
    x, q, scale = inputs(m, 320, 1024, True, torch.float16)
    x[0] = 0
    bias = torch.linspace(-1, 1, 320, device=DEVICE, dtype=torch.float16)
    out = fp8_skinny_linear(x, q, scale, bias)
    check(out, x, q, scale, bias)
    assert torch.equal(out[0], bias)
    cfg = fp8_skinny_config(m, 6144, 4096, num_sms=132)
    assert (cfg.block_n, cfg.block_m, cfg.split_k, cfg.quantize_first) == (
        128, block_m, split_k, quantize_first
    )  # fmt: skip


@pytest.mark.parametrize("quantize_first", [False, True])
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("m", [5, 40])
def test_a_gated_input_is_the_silu_mul_then_the_kernel(
    m: int, split_k: int, quantize_first: bool
) -> None:
    """``gated``: x holds a SwiGLU's gate then up. The output is the kernel's on
    ``silu_and_mul``'s output, bit for bit, whether the quantization kernel applies the SiLU-mul
    (x quantized first) or ``silu_and_mul`` runs before the launch (x quantized in the loop)."""
    dtype = X_DTYPES[-1]
    _, q, scale = inputs(m, 256, 512, True, dtype)
    gen = torch.Generator().manual_seed(m + split_k)
    gate_up = (torch.randn(m, 1024, generator=gen) * 2).to(dtype).to(DEVICE)
    cfg = Fp8SkinnyConfig(64, 128, max(16, 1 << (m - 1).bit_length()), split_k, 4, 2,
                          quantize_first)  # fmt: skip
    out = fp8_skinny_linear(gate_up, q, scale, config=cfg, gated=True)
    assert torch.equal(out, fp8_skinny_linear(silu_and_mul(gate_up), q, scale, config=cfg))


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("m", [5, 40])
def test_an_x_quantized_by_the_caller_is_the_quantize_first_path(m: int, split_k: int) -> None:
    """``x_scales``: x arrives in e4m3 with its 128-column scales (an FP8 layer's input from
    ``rmsnorm_fp8``): the output is the kernel's on x quantized before the launch, bit for
    bit, in ``out_dtype``."""
    dtype = X_DTYPES[-1]
    x, q, scale = inputs(m, 256, 512, True, dtype)
    cfg = Fp8SkinnyConfig(64, 128, max(16, 1 << (m - 1).bit_length()), split_k, 4, 2, True)
    xq, xs = quantize_fp8(x, 128)
    out = fp8_skinny_linear(xq, q, scale, config=cfg, x_scales=xs, out_dtype=dtype)
    assert out.dtype == dtype and torch.equal(out, fp8_skinny_linear(x, q, scale, config=cfg))


def test_bad_prefetch_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="prefetch_steps"):
        Fp8SkinnyConfig(64, 128, 64, 1, 4, 8, True, prefetch_steps=3)
    with (
        cached_setting(PREFETCH_ENV, "3", skinny_prefetch_steps),
        pytest.raises(ConfigError, match=PREFETCH_ENV),
    ):
        skinny_prefetch_steps()


def test_bad_operands_are_refused() -> None:
    x, q, scale = inputs(2, 64, 128, True, torch.float16)
    with pytest.raises(ValueError, match="fp8_skinny_linear"):
        fp8_skinny_linear(x.repeat(257, 1), q, scale)  # 514 rows
    with pytest.raises(ValueError, match="fp8_skinny_linear"):
        fp8_skinny_linear(x, q.float(), scale)
    with pytest.raises(ValueError, match="scale blocks"):
        fp8_skinny_linear(x, q, scale, block=(128, 64))
    xq, xs = quantize_fp8(x, 128)
    with pytest.raises(ValueError, match="needs its x_scales"):
        fp8_skinny_linear(xq, q, scale)
    with pytest.raises(ValueError, match="a quantized x is e4m3"):
        fp8_skinny_linear(xq, q, scale, x_scales=xs[:, :0])
    with pytest.raises(ValueError, match="a quantized x is e4m3"):
        fp8_skinny_linear(x, q, scale, x_scales=xs)


@NEEDS_CUDA_GRAPHS
def test_split_k_replays_in_cuda_graph_with_programmatic_launch() -> None:
    x, q, scale = inputs(8, 4096, 4096, True, torch.bfloat16)
    cfg = Fp8SkinnyConfig(128, 128, 16, 4, 4, 4)
    expected = fp8_skinny_linear(x, q, scale, config=cfg)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_skinny_linear(x, q, scale, config=cfg, pdl=True)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected)
    assert int(skinny_gemm._COUNTERS[x.device].abs().sum()) == 0


@NEEDS_CUDA_GRAPHS
def test_the_chained_tiling_replays_in_cuda_graph_with_l2_requests() -> None:
    """The chained loop's default at 64 rows (K in two) with W's first steps asked of L2
    before the dependent-launch wait: replays give the eager output and leave the arrival
    counters at zero."""
    x, q, scale = inputs(64, 4096, 4096, True, torch.bfloat16)
    cfg = replace(fp8_skinny_config(64, 4096, 4096, num_sms=132, chained=True), prefetch_steps=4)
    assert cfg.split_k == 2
    expected = fp8_skinny_linear(x, q, scale, config=cfg, x_row_scale=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_skinny_linear(x, q, scale, config=cfg, pdl=True, x_row_scale=True)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected)
    assert int(skinny_gemm._COUNTERS[x.device].abs().sum()) == 0


@pytest.mark.skipif(DEVICE.type != "cuda", reason="the method takes this path on CUDA only")
@pytest.mark.parametrize("spec", METHOD_SPECS)
@pytest.mark.parametrize("m", [2, 64, 65])
def test_fp8_method_takes_the_kernel_for_decode_steps(spec: Fp8Spec, m: int) -> None:
    """Up to 64 rows the method's output is the kernel's, bit for bit (x per token past 32 rows
    where the setting and W's layout have it); past them, cuBLAS's or the block GEMM's
    (per-token, static or per-group scales); all within the activation rounding of the exact
    product."""
    x, q, scale = inputs(m, 512, 1024, spec.weight == "channel", torch.bfloat16, spec.block)
    layer = method_layer(q, scale)
    out = Fp8LinearMethod(spec)._matmul(layer, x)  # type: ignore[arg-type]
    if m <= 64:
        rows = m > QUANTIZE_FIRST_ABOVE and skinny_row_scale(spec)
        want = fp8_skinny_linear(x, q, scale, block=spec.block, x_row_scale=rows)
        assert torch.equal(out, want)
    assert rel(out, x.float() @ dequantize_fp8_weight(q, scale, spec.block).T) < EXACT_TOL


@pytest.mark.skipif(DEVICE.type != "cuda", reason="the method takes this path on CUDA only")
@pytest.mark.parametrize("spec", METHOD_SPECS)
@pytest.mark.parametrize("m", [16, 40])
@pytest.mark.parametrize("setting", ["0", "1"])
def test_the_setting_gives_steps_past_32_rows_one_x_scale_a_row(
    spec: Fp8Spec, m: int, setting: str
) -> None:
    """``KVSERVE_FP8_SKINNY_ROW_SCALE=1`` (the default): a step of 33-64 rows of per-channel or
    per-tensor W quantizes x per token (the kernel's ``x_row_scale``), and the norm is asked for
    the same scheme, which gives the same bits; 16 rows (x quantized in the loop), W's blocks
    and the setting at 0 keep a scale a K step."""
    x, q, scale = inputs(m, 512, 1024, spec.weight == "channel", torch.bfloat16, spec.block)
    layer = method_layer(q, scale)
    method = Fp8LinearMethod(spec)
    rows = setting == "1" and m > 32 and spec.block is None
    with cached_setting(SKINNY_ROW_SCALE_ENV, setting, skinny_row_scale_enabled):
        out = method._matmul(layer, x)  # type: ignore[arg-type]
        scheme = method.fp8_input_scheme(layer, x)  # type: ignore[arg-type]
        if scheme is not None:
            xq, xs = quantize_fp8(x, scheme.group)
            taken = method.apply_fp8(layer, Fp8Activation(xq, xs, x.dtype), None)  # type: ignore[arg-type]
            assert torch.equal(taken, out)
    want = fp8_skinny_linear(x, q, scale, block=spec.block, x_row_scale=rows)
    assert torch.equal(out, want)
    assert (scheme is not None and scheme.group is None) == rows
    assert rel(out, x.float() @ dequantize_fp8_weight(q, scale, spec.block).T) < EXACT_TOL


@pytest.mark.skipif(DEVICE.type != "cuda", reason="the method takes this path on CUDA only")
@pytest.mark.parametrize("spec", [*METHOD_SPECS, Fp8Spec("channel", "tensor")])
@pytest.mark.parametrize("m", [1, 16, 40, 65, 300])
def test_fp8_method_folds_the_silu_mul_into_its_activation_quantization(
    spec: Fp8Spec, m: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``KVSERVE_FP8_SILU_QUANT=1`` a down projection's steps that quantize x by their own
    kernel (past 32 rows: the tensor-core kernel, then cuBLAS or the block GEMM) give the
    SiLU-mul-then-apply output bit for bit from the gate/up output; the others, a dynamic
    per-tensor scale past 64 rows, and the switch at 0 decline (None)."""
    _, q, scale = inputs(m, 512, 1024, spec.weight == "channel", torch.bfloat16, spec.block)
    gate_up = torch.randn(m, 2048, device=DEVICE).to(torch.bfloat16)
    layer = method_layer(q, scale)
    method = Fp8LinearMethod(spec)
    # the tensor-core kernel (33-64 rows) quantizes per token or per 128-column group whatever
    # the scheme; past it a dynamic per-tensor scale needs the SiLU-mul's whole output first
    folds = 32 < m <= 64 or (m > 64 and spec.activation != "tensor")
    for switch in ("0", "1"):
        monkeypatch.setenv(SILU_QUANT_ENV, switch)
        silu_quant_enabled.cache_clear()
        try:
            out = method.apply_after_silu_mul(layer, gate_up, None)  # type: ignore[arg-type]
        finally:
            silu_quant_enabled.cache_clear()
        if switch == "1" and folds:
            want = method._matmul(layer, silu_and_mul(gate_up))  # type: ignore[arg-type]
            assert out is not None and torch.equal(out, want)
        else:
            assert out is None


def test_row_settings_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    for env, value, cached, message in (
        (SKINNY_ROWS_ENV, "513", skinny_max_rows, "from 0 to 512"),
        (W8A16_ROWS_ENV, "x", w8a16_max_rows, "from 0 to 4"),
    ):
        monkeypatch.setenv(env, value)
        cached.cache_clear()
        try:
            with pytest.raises(ConfigError, match=message):
                cached()
        finally:
            monkeypatch.delenv(env)
            cached.cache_clear()
    assert skinny_max_rows() == 64
