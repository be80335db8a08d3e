"""The CUDA-core GEMV for FP8 weights (``fp8_gemv``) against ``x.float() @ (w.float() *
scale).T``: 1-4 rows, per-row and per-tensor scales, N and K tails, split K, bias, CUDA graph
replay; and the FP8 linear method's weight-only path on it. (Its FP4 mode is tested through
``fp4_linear`` in ``test_fp4_gemm.py``.)

``KVSERVE_TEST_DEVICE=cpu TRITON_INTERPRET=1 pytest --noconftest tests/gpu/test_word_gemv.py``
runs them through Triton's interpreter on a CPU.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

from kernel_test_device import (  # noqa: E402
    BF16_UNLESS_INTERPRETED,
    DEVICE,
    INTERPRETED,
    NEEDS_CUDA_GRAPHS,
    ON_GPU_ONLY,
)
from test_fp4_gemm import fp4_weight  # noqa: E402

from kvserve.env_settings import check_environment  # noqa: E402
from kvserve.errors import ConfigError  # noqa: E402
from kvserve.kernels import skinny_gemm  # noqa: E402
from kvserve.kernels.activation import silu_and_mul  # noqa: E402
from kvserve.kernels.fp4_gemm import fp4_linear  # noqa: E402
from kvserve.kernels.fp8_gemm import dequantize_fp8_weight  # noqa: E402
from kvserve.kernels.rmsnorm import rms_norm  # noqa: E402
from kvserve.kernels.word_gemv import (  # noqa: E402
    GemvConfig,
    fp8_gemv,
    fp8_gemv_config,
    gemv_config,
    half_gemv,
    half_gemv_config,
)
from kvserve.layers.linear import Linear  # noqa: E402
from kvserve.quant import unquantized  # noqa: E402
from kvserve.quant.fp4_method import Fp4LinearMethod  # noqa: E402
from kvserve.quant.fp8_config import Fp8Spec  # noqa: E402
from kvserve.quant.fp8_method import W8A16_ROWS_ENV, Fp8LinearMethod, w8a16_max_rows  # noqa: E402
from kvserve.quant.fp8_weights import quantize_weight  # noqa: E402
from kvserve.quant.mxfp4 import MXFP4  # noqa: E402
from kvserve.quant.nvfp4 import NVFP4  # noqa: E402

pytestmark = pytest.mark.gpu
X_DTYPES = [torch.float32] if INTERPRETED else [torch.bfloat16, torch.float16, torch.float32]
# K a multiple of the 32-word step (512 = 128 words) or not (300 = 75 words); N tails
SHAPES = [(256, 512), (200, 300), pytest.param(6144, 4096, marks=ON_GPU_ONLY)]
TOL = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-4}
# FP8 products summed in f16x2 chains (GPU only: the interpreter runs no PTX, and takes fp32)
HALF_SUMS = [False] if INTERPRETED else [False, True]


def inputs(m: int, n: int, k: int, per_row: bool, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(m * 7919 + n + k)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = torch.randn(n, k, generator=gen) / k**0.5
    q, scale = quantize_weight(w, "channel" if per_row else "tensor")
    return x.to(DEVICE), q.to(DEVICE), scale.to(DEVICE)


def check(out: torch.Tensor, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
          bias: torch.Tensor | None = None) -> None:  # fmt: skip
    ref = x.float() @ (q.float() * scale.reshape(-1, 1).float()).T
    if bias is not None:
        ref = ref + bias.float()
    assert out.dtype == x.dtype and out.shape == ref.shape
    err = (out.float() - ref).abs().max() / ref.abs().max()
    assert err < TOL[x.dtype], f"relative error {err:.3g}"


@pytest.mark.parametrize("half_sums", HALF_SUMS)
@pytest.mark.parametrize("dtype", X_DTYPES)
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("per_row", [True, False])
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_matches_reference(
    m: int, n: int, k: int, per_row: bool, split_k: int, dtype: torch.dtype, half_sums: bool
) -> None:
    x, q, scale = inputs(m, n, k, per_row, dtype)
    cfg = GemvConfig(64, 16, split_k, half_sums=half_sums)
    check(fp8_gemv(x, q, scale, config=cfg), x, q, scale)


@ON_GPU_ONLY
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("split_k", [1, 4])
@pytest.mark.parametrize("magnitude", [1e-6, 1.0, 2e3])
def test_half_sums_keep_large_and_small_activations(
    magnitude: float, split_k: int, dtype: torch.dtype
) -> None:
    """Each program takes x at its own power-of-two factor, so rows of very different size
    (one with an outlier 30x its rest, one of zeros) neither overflow f16 nor sink into its
    subnormals: every row within the tolerance of its own reference."""
    n, k = 512, 4096
    x, q, scale = inputs(4, n, k, True, torch.float32)
    x = x * magnitude
    x[1, 77] = 30 * magnitude
    x[2] = 0.0
    x[3] *= 1e-3
    x = x.to(dtype)
    out = fp8_gemv(x, q, scale, config=GemvConfig(64, 64, split_k, half_sums=True))
    ref = x.float() @ (q.float() * scale.reshape(-1, 1)).T
    assert torch.isfinite(out).all()
    assert (out[2] == 0).all()
    for row in (0, 1, 3):
        if ref[row].abs().max() < (2**-10 if dtype == torch.float16 else 0.0):
            continue  # outputs among fp16's subnormals: not the sums' error to measure
        err = (out[row].float() - ref[row]).abs().max() / ref[row].abs().max()
        assert err < TOL[dtype], f"row {row}: relative error {err:.3g}"


# (N, K): whole 128 x 128 blocks; partial last blocks of rows and columns (the GLM-4.5 shared
# expert's down projection has K = 1408 = 11 blocks; 300 leaves a 44-column block)
BLOCK_SHAPES = [(256, 512), (200, 300), (320, 1408)]


@pytest.mark.parametrize("half_sums", HALF_SUMS)
@pytest.mark.parametrize("dtype", X_DTYPES)
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize(("n", "k"), BLOCK_SHAPES)
@pytest.mark.parametrize("m", [1, 2, 4])
def test_block_scales_match_the_dequantized_weight(
    m: int, n: int, k: int, split_k: int, dtype: torch.dtype, half_sums: bool
) -> None:
    """128 x 128 block scales (DeepSeek-V3 / Qwen3-FP8): each word's partial sum times its
    block's scale, at the default tile and at a 64-row tile with split K."""
    gen = torch.Generator().manual_seed(m + n + k)
    x = torch.randn(m, k, generator=gen).to(dtype).to(DEVICE)
    w = torch.randn(n, k, generator=gen) / k**0.5
    w[: n // 2, :128] *= 40.0  # blocks of different scales
    q, scale = quantize_weight(w, "block", (128, 128))
    q, scale = q.to(DEVICE), scale.to(DEVICE)
    ref = x.float() @ dequantize_fp8_weight(q, scale, (128, 128)).T
    for cfg in (None, GemvConfig(64, 16, split_k, half_sums=half_sums)):
        out = fp8_gemv(x, q, scale, config=cfg, block=(128, 128))
        err = (out.float() - ref).abs().max() / ref.abs().max()
        assert out.dtype == dtype and err < TOL[dtype], f"relative error {err:.3g}"


def test_block_scales_of_the_wrong_shape_are_refused() -> None:
    x, q, _ = inputs(1, 256, 512, True, torch.float32)
    with pytest.raises(ValueError, match="fp8_gemv"):
        fp8_gemv(x, q, torch.ones(2, 3, device=DEVICE), block=(128, 128))
    with pytest.raises(ValueError, match="fp8_gemv"):
        fp8_gemv(x, q, torch.ones(8, 8, device=DEVICE), block=(32, 64))


@pytest.mark.parametrize("m", [1, 4])
def test_default_config_and_bias(m: int) -> None:
    x, q, scale = inputs(m, 320, 1024, True, torch.float32)
    bias = torch.linspace(-1, 1, 320, device=DEVICE)
    check(fp8_gemv(x, q, scale, bias), x, q, scale, bias)
    assert gemv_config(320, 256, rows=m).block_n == (128 if m <= 2 else 64)
    assert fp8_gemv_config(320, 256, m, 132).half_sums == (m <= 2)


def test_bad_operands_are_refused() -> None:
    x, q, scale = inputs(2, 64, 128, True, torch.float32)
    with pytest.raises(ValueError, match="fp8_gemv"):
        fp8_gemv(torch.cat([x, x, x]), q, scale)  # 6 rows
    with pytest.raises(ValueError, match="fp8_gemv"):
        fp8_gemv(x[:, :64], q, scale)
    with pytest.raises(ValueError, match="fp8_gemv"):
        fp8_gemv(x, q.float(), scale)


@pytest.mark.parametrize("dtype", [BF16_UNLESS_INTERPRETED, torch.float16])
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize(
    ("n", "k"), [(256, 512), (200, 300), pytest.param(6144, 4096, marks=ON_GPU_ONLY)]
)
@pytest.mark.parametrize("m", [1, 2, 4])
def test_half_weights_match_f_linear(m: int, n: int, k: int, split_k: int, dtype) -> None:  # noqa: ANN001
    """16-bit weights two a word (``half_gemv``): N and K tails, split K, a bias; the default
    tile and a narrow one."""
    gen = torch.Generator().manual_seed(m + n + k)
    x = torch.randn(m, k, generator=gen).to(DEVICE, dtype)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(DEVICE, dtype)
    bias = torch.randn(n, generator=gen).to(DEVICE, dtype)
    ref = x.float() @ w.float().T + bias.float()
    for cfg in (None, GemvConfig(64, 16, split_k)):
        out = half_gemv(x, w, bias, cfg)
        err = (out.float() - ref).abs().max() / ref.abs().max()
        assert out.dtype == dtype and err < TOL[dtype], f"relative error {err:.3g}"


def test_half_gemv_config_takes_narrow_wide_tiles_at_one_row() -> None:
    """One row, N up to four 16-row tiles an SM: 16 x 128 words, K split to about four
    programs an SM (the tiles timed fastest on the H200); else the GEMV's default."""
    assert half_gemv_config(5120, 1024, 1, 132) == GemvConfig(16, 128, 1)  # Qwen3-30B-A3B qkv
    assert half_gemv_config(2048, 2048, 1, 132) == GemvConfig(16, 128, 4)  # its o
    assert half_gemv_config(28672, 2048, 1, 132) == gemv_config(28672, 2048, num_sms=132)
    assert half_gemv_config(5120, 1024, 2, 132) == gemv_config(5120, 1024, rows=2, num_sms=132)


def test_half_weights_refuse_what_they_cannot_take() -> None:
    x = torch.randn(2, 64, device=DEVICE, dtype=torch.float16)
    w = torch.randn(32, 64, device=DEVICE, dtype=torch.float16)
    with pytest.raises(ValueError, match="half_gemv"):
        half_gemv(x.float(), w.float())  # fp32: not a 16-bit dtype
    with pytest.raises(ValueError, match="half_gemv"):
        half_gemv(x, w[:, :63])  # an odd K
    with pytest.raises(ValueError, match="half_gemv"):
        half_gemv(torch.cat([x, x, x]), w)  # 6 rows


def test_unquantized_method_takes_the_half_gemv_up_to_its_row_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``KVSERVE_BF16_GEMV_ROWS`` bounds the 16-bit steps that take ``half_gemv`` (CUDA only:
    elsewhere the method keeps F.linear); a bad value is refused when an engine starts."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 512, generator=gen).to(DEVICE, torch.float16)
    w = (torch.randn(256, 512, generator=gen) / 512**0.5).to(DEVICE, torch.float16)
    layer = SimpleNamespace(weight=w, launch_pdl=False)
    monkeypatch.setenv(unquantized.GEMV_ROWS_ENV, "5")
    unquantized.gemv_max_rows.cache_clear()
    with pytest.raises(ConfigError, match="from 0 to 4"):
        check_environment()  # what an engine runs first
    monkeypatch.setenv(unquantized.GEMV_ROWS_ENV, "2")
    unquantized.gemv_max_rows.cache_clear()
    try:
        method = unquantized.make_method(None)
        two = method.apply(layer, x[:2], None)  # type: ignore[arg-type]
        if x.is_cuda:
            assert torch.equal(two, half_gemv(x[:2], w))
        torch.testing.assert_close(two.float(), x[:2].float() @ w.float().T, rtol=4e-3, atol=4e-3)
        four = method.apply(layer, x, None)  # type: ignore[arg-type]
        assert torch.equal(four, torch.nn.functional.linear(x, w))  # past the setting: F.linear
    finally:
        monkeypatch.delenv(unquantized.GEMV_ROWS_ENV)
        unquantized.gemv_max_rows.cache_clear()


@NEEDS_CUDA_GRAPHS
def test_split_k_replays_in_cuda_graph() -> None:
    x, q, scale = inputs(2, 4096, 4096, True, torch.bfloat16)
    cfg = GemvConfig(128, 32, 4)
    expected = fp8_gemv(x, q, scale, config=cfg)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_gemv(x, q, scale, config=cfg)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected)
    assert int(skinny_gemm._COUNTERS[x.device].abs().sum()) == 0


@NEEDS_CUDA_GRAPHS
def test_programmatic_launch_chain_in_cuda_graph_equals_plain_launches() -> None:
    """Norm -> FP8 GEMV (split K) -> SiLU-mul -> NVFP4 GEMV (split K, asm scale loads) ->
    norm -> MXFP4 GEMV, each reading what the one before wrote: with PDL each GEMV loads its
    first weights before it waits; replayed from a graph, bit-equal to plain launches."""
    x, q8, s8 = inputs(1, 4096, 2048, True, torch.bfloat16)
    nv, mx = fp4_weight("nvfp4", 2048, 2048, seed=1), fp4_weight("mxfp4", 1024, 2048, seed=2)
    norm_w = torch.rand(2048, device=DEVICE, dtype=torch.bfloat16) + 0.5
    nv_cfg = replace(gemv_config(2048, 256, scale_group=16), split_k=4, asm_scale_loads=True)

    def chain(pdl: bool) -> torch.Tensor:
        h = fp8_gemv(rms_norm(x, norm_w, 1e-6, pdl=pdl), q8, s8, pdl=pdl)
        h = fp4_linear(silu_and_mul(h, pdl=pdl), *nv, config=nv_cfg, pdl=pdl)
        return fp4_linear(rms_norm(h, norm_w, 1e-6, pdl=pdl), *mx, pdl=pdl)

    expected = chain(pdl=False)
    assert torch.equal(chain(pdl=True), expected)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(pdl=True)
    for _ in range(20):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected)
    assert int(skinny_gemm._COUNTERS[x.device].abs().sum()) == 0


@pytest.mark.skipif(DEVICE.type != "cuda", reason="the method takes this path on CUDA only")
@pytest.mark.parametrize(
    "spec",
    [Fp8Spec("channel", "token"), Fp8Spec("tensor", "static"),
     Fp8Spec("block", "group", (128, 128))],
)  # fmt: skip
def test_fp8_method_runs_small_steps_weight_only(
    spec: Fp8Spec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With KVSERVE_FP8_W8A16_ROWS=4, steps of up to 4 rows run on the GEMV and skip the
    activation quantization (exact to the dequantized weight); the W8A8 path stays within its
    activation rounding."""
    x, q, scale = inputs(4, 512, 1024, spec.weight == "channel", torch.bfloat16)
    if spec.block:
        q, scale = quantize_weight(q.float() * scale.reshape(-1, 1).float(), "block", spec.block)
    layer = SimpleNamespace(weight=q, weight_scale=scale, launch_pdl=False,
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
    if spec.block:
        q, scale = dequantize_fp8_weight(q, scale, spec.block), torch.ones(1, device=DEVICE)
    check(out, x, q, scale)
    torch.testing.assert_close(out.float(), w8a8.float(), atol=0.1, rtol=0.1)


@pytest.mark.skipif(DEVICE.type != "cuda", reason="the method takes these paths on CUDA only")
@pytest.mark.parametrize("m", [1, 4, 80])
def test_fp8_method_adds_the_bias_once(m: int) -> None:
    """The bias of a biased projection (GLM-4.5's q/k/v) in the decode kernels' epilogue (one
    row: the GEMV; four: the tensor-core kernel) or after cuBLAS (80): added exactly once."""
    x, q, scale = inputs(m, 512, 1024, True, torch.bfloat16)
    bias = torch.linspace(-4, 4, 512, device=DEVICE).to(torch.bfloat16)
    layer = SimpleNamespace(weight=q, weight_scale=scale, launch_pdl=False)
    method = Fp8LinearMethod(Fp8Spec("channel", "token"))
    with_bias = method.apply(layer, x, bias)  # type: ignore[arg-type]
    without = method.apply(layer, x, None)  # type: ignore[arg-type]
    torch.testing.assert_close(with_bias.float(), without.float() + bias.float(), atol=0.05, rtol=0)


def test_weight_only_rows_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(W8A16_ROWS_ENV, "5")
    w8a16_max_rows.cache_clear()
    try:
        with pytest.raises(ConfigError, match="from 0 to 4"):
            w8a16_max_rows()
    finally:
        monkeypatch.delenv(W8A16_ROWS_ENV)
        w8a16_max_rows.cache_clear()
    assert w8a16_max_rows() == 1


def _gated_stack(n: int, k: int, seed: int) -> torch.Tensor:
    """A gate/up stack [n, k] whose gate rows run from large negative to large positive
    pre-activations, so SiLU's whole curve is exercised."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) / k**0.5
    w[: n // 2] *= torch.linspace(-6, 6, n // 2)[:, None]
    return w


def assert_gated(out: torch.Tensor, plain: torch.Tensor) -> None:
    """The gated GEMV against the plain one's output through the SiLU-mul kernel: the same
    products and roundings, but a split's row scale is applied before the split sum."""
    ref = silu_and_mul(plain).float()
    assert out.shape == ref.shape and out.dtype == plain.dtype
    err = (out.float() - ref).abs().max() / ref.abs().max()
    assert err < TOL[out.dtype] / 4, f"relative error {err:.3g}"


# (layout, N, K): N tails (I = 200) where the layout takes them; FP8 128-row block scales need I
# a whole number of blocks (a stack that is not is refused: the test below)
GATED_CASES = [("channel", 256, 256), ("channel", 400, 300), ("block", 256, 256),
               ("half", 256, 256), ("half", 400, 300)]  # fmt: skip


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize(("layout", "n", "k"), GATED_CASES)
@pytest.mark.parametrize("m", [1, 2, 4])
def test_gated_gemv_is_the_silu_mul_of_the_plain_one(
    m: int, n: int, k: int, layout: str, split_k: int
) -> None:
    """``gated``: programs pair gate rows with the up rows of the same outputs and apply the
    SiLU-mul to the K splits' sum: per-channel and 128-row block FP8 scales and 16-bit weights,
    N tails, split K."""
    dtype = torch.float32 if INTERPRETED else torch.bfloat16
    gen = torch.Generator().manual_seed(m + n + k)
    x = torch.randn(m, k, generator=gen).to(DEVICE, dtype)
    w = _gated_stack(n, k, m + n)
    for cfg in (GemvConfig(64, 16, split_k, half_sums=not INTERPRETED), GemvConfig(32, 32, 1)):
        if layout == "half":
            w16 = w.to(DEVICE, torch.float16 if INTERPRETED else dtype)
            x16 = x.to(w16.dtype)
            out = half_gemv(x16, w16, config=cfg, gated=True)
            assert_gated(out, half_gemv(x16, w16, config=cfg))
            continue
        block = (128, 128) if layout == "block" else None
        q, scale = quantize_weight(w, layout, block)
        q, scale = q.to(DEVICE), scale.to(DEVICE)
        out = fp8_gemv(x, q, scale, config=cfg, block=block, gated=True)
        assert_gated(out, fp8_gemv(x, q, scale, config=cfg, block=block))


def test_gated_gemv_refuses_what_it_cannot_take() -> None:
    x, q, scale = inputs(1, 2 * 200, 256, True, torch.float32)
    with pytest.raises(ValueError, match="gate/up"):  # I = 200 is not whole 128-row blocks
        qb, sb = quantize_weight(torch.randn(400, 256), "block", (128, 128))
        fp8_gemv(x, qb.to(DEVICE), sb.to(DEVICE), block=(128, 128), gated=True)
    with pytest.raises(ValueError, match="bias"):
        fp8_gemv(x, q, scale, torch.zeros(400, device=DEVICE), gated=True)
    with pytest.raises(ValueError, match="gate/up"):  # an odd N
        fp8_gemv(x, q[:399], scale[:399], gated=True)
    packed, block, row = (
        t.to(DEVICE) if t is not None else None for t in fp4_weight("nvfp4", 400, 256)
    )
    with pytest.raises(ValueError, match="without a bias"):
        fp4_linear(x, packed, block, row, torch.zeros(400, device=DEVICE), gated=True)


def _gate_up_layer(kind: str) -> Linear:
    """A gate/up layer [2 x 256, 512] with dummy weights in ``kind``'s format, on DEVICE."""
    methods = {
        "bf16": unquantized.UnquantizedLinearMethod,
        "fp8_channel": lambda: Fp8LinearMethod(Fp8Spec("channel", "token")),
        "fp8_block": lambda: Fp8LinearMethod(Fp8Spec("block", "group", (128, 128))),
        "nvfp4": lambda: Fp4LinearMethod(NVFP4, "online"),
        "mxfp4": lambda: Fp4LinearMethod(MXFP4, "online"),
    }
    with torch.device(DEVICE):
        layer = Linear(512, [256, 256], False, torch.bfloat16, methods[kind](), "mlp.gate_up")
        layer.init_dummy(torch.Generator(DEVICE).manual_seed(3))
    return layer


@pytest.mark.skipif(DEVICE.type != "cuda", reason="the methods take the GEMV on CUDA only")
@pytest.mark.parametrize("kind", ["bf16", "fp8_channel", "fp8_block", "nvfp4", "mxfp4"])
def test_gate_up_layer_applies_the_silu_mul_on_the_gemv(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Linear.forward_gated`` (the dense MLP with KVSERVE_GATED_GEMV=1): a one-token step of
    each method's GEMV in its gated mode gives the layer's output through the SiLU-mul kernel;
    a step the GEMV does not take gives None (the MLP then runs the two kernels)."""
    monkeypatch.setenv(unquantized.GEMV_ROWS_ENV, "1")
    unquantized.gemv_max_rows.cache_clear()
    try:
        layer = _gate_up_layer(kind)
        x = torch.randn(1, 512, device=DEVICE, dtype=torch.bfloat16)
        assert_gated(layer.forward_gated(x), layer(x))
        assert layer.forward_gated(torch.cat([x] * 8)) is None
    finally:
        monkeypatch.delenv(unquantized.GEMV_ROWS_ENV)
        unquantized.gemv_max_rows.cache_clear()
