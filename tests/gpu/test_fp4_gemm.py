"""The weight-only FP4 GEMM (NVFP4 and MXFP4) against its torch reference: rows 1..256 below,
at and above a tile, N and K tails, split K, bias and row scales, CUDA graph replay.

``KVSERVE_TEST_DEVICE=cpu TRITON_INTERPRET=1 pytest --noconftest tests/gpu/test_fp4_gemm.py``
runs them through Triton's interpreter on a CPU (fp32 only; Llama-sized shapes are skipped).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernel_test_device import (  # noqa: E402
    BF16_UNLESS_INTERPRETED,
    DEVICE,
    INTERPRETED,
    NEEDS_CUDA_GRAPHS,
    NEEDS_PTX,
    ON_GPU_ONLY,
)

from kvserve.kernels import skinny_gemm  # noqa: E402
from kvserve.kernels.fp4_dequantize import DequantGemmConfig, dequantize_fp4_dense  # noqa: E402
from kvserve.kernels.fp4_gemm import (  # noqa: E402
    Fp4GemmConfig,
    block_m_for,
    candidate_configs,
    fp4_linear,
)
from kvserve.kernels.fp4_reference import dequantize_fp4  # noqa: E402
from kvserve.kernels.word_gemv import GemvConfig  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = [BF16_UNLESS_INTERPRETED, torch.float32]
# The dequantized weight is exact in bf16, so the error is the output's bf16 rounding (values of
# order 1) and the summation order; fp32 (tf32 off): summation order only.
TOL = {torch.bfloat16: 2e-2, torch.float16: 2e-3, torch.float32: 1e-4}
FORMATS = ["nvfp4", "mxfp4"]
ROWS = [1, 3, 16, 33, 64, 100, 256]
# (N, K): N a multiple of the tiles or not, K a multiple of BLOCK_K (64) or not (160, 96)
SMALL_SHAPES = [(256, 512), (200, 160), (72, 96)]
LLAMA_SHAPES = [
    pytest.param(6144, 4096, marks=ON_GPU_ONLY),
    pytest.param(4096, 14336, marks=ON_GPU_ONLY),
    pytest.param(28672, 4096, marks=ON_GPU_ONLY),
]


def fp4_weight(
    fmt: str, n: int, k: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Random codes; scales that make the output of order 1 for unit-variance x."""
    gen = torch.Generator().manual_seed(seed * 7919 + n + k)
    packed = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.int32).to(torch.uint8)
    target = 1 / (3 * k**0.5)
    if fmt == "nvfp4":
        block = target * (0.5 + torch.rand(n, k // 16, generator=gen))
        row = 0.5 + torch.rand(n, generator=gen)
        return packed.to(DEVICE), block.to(torch.float8_e4m3fn).to(DEVICE), row.to(DEVICE)
    exponent = round(torch.tensor(target).log2().item()) + torch.randint(-1, 2, (n, k // 32))
    return packed.to(DEVICE), (exponent + 127).to(torch.uint8).to(DEVICE), None


def activations(m: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(m * 31 + k)
    return torch.randn(m, k, generator=gen).to(dtype).to(DEVICE)


def check(out: torch.Tensor, x: torch.Tensor, weight: tuple, bias: torch.Tensor | None = None):
    ref = x.float() @ dequantize_fp4(*weight).T
    if bias is not None:
        ref = ref + bias.float()
    assert out.shape == ref.shape and out.dtype == x.dtype
    tol = TOL[x.dtype]
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


def small_config(m: int, split_k: int) -> Fp4GemmConfig:
    return Fp4GemmConfig(64, 64, block_m_for(m), split_k, 4, 3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize(("n", "k"), SMALL_SHAPES)
@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_matches_reference(fmt: str, m: int, n: int, k: int, split_k: int, dtype) -> None:
    weight = fp4_weight(fmt, n, k)
    x = activations(m, k, dtype)
    check(fp4_linear(x, *weight, config=small_config(m, split_k)), x, weight)


@pytest.mark.parametrize("dtype", [*DTYPES, torch.float16])
@pytest.mark.parametrize(("n", "k"), [*SMALL_SHAPES, (130, 1056)])
@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_matches_reference(fmt: str, n: int, k: int, dtype: torch.dtype) -> None:
    """Bit for bit: the same fp32 products (code x block scale exact, times the row scale) and
    one rounding to ``dtype``; N and K tails of the 64 x 256 tile (words or, interpreted, bytes)."""
    weight = fp4_weight(fmt, n, k)
    dense = dequantize_fp4_dense(*weight, dtype)
    assert torch.equal(dense, dequantize_fp4(*weight, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 100, 600])
@pytest.mark.parametrize("fmt", FORMATS)
def test_dequant_gemm_matches_reference(fmt: str, m: int, dtype: torch.dtype) -> None:
    n, k = 200, 160
    weight = fp4_weight(fmt, n, k)
    bias = torch.linspace(-1, 1, n, device=DEVICE).to(dtype)
    x = activations(m, k, dtype)
    out = fp4_linear(x.view(1, m, k), *weight, bias, config=DequantGemmConfig())
    check(out.view(m, n), x, weight, bias)
    check(fp4_linear(x, *weight, config=DequantGemmConfig(block_n=32, block_k=64)), x, weight)


@NEEDS_PTX
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize(("n", "k"), SMALL_SHAPES)
@pytest.mark.parametrize("m", [2, 16, 33, 100])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("w_as_b", [False, True], ids=["w_as_a", "w_as_b"])
@pytest.mark.parametrize("words", [True, False], ids=["words", "bytes"])
def test_both_dequants_match_reference(
    words: bool, w_as_b: bool, fmt: str, m: int, n: int, k: int, split_k: int, dtype: torch.dtype
) -> None:
    """``Fp4GemmConfig.word_dequant``: W read as words (eight codes decoded at a time, the
    default) or byte by byte (two), as either MMA operand (``w_as_b``), in each activation
    dtype; K tails of 96 and 160 take the masked loads."""
    weight = fp4_weight(fmt, n, k)
    x = activations(m, k, dtype)
    block_m = min(32, block_m_for(m)) if w_as_b else block_m_for(m)
    cfg = Fp4GemmConfig(64, 64, block_m, split_k, 4, 3, words, w_as_b)
    check(fp4_linear(x, *weight, config=cfg), x, weight)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize(("n", "k"), SMALL_SHAPES)
@pytest.mark.parametrize("m", [3, 20, 40])
@pytest.mark.parametrize("fmt", FORMATS)
def test_w_as_b_matches_reference(fmt: str, m: int, n: int, k: int, split_k: int, dtype) -> None:
    """``Fp4GemmConfig.w_as_b`` (x @ W.T, W the MMA's B operand) with the byte dequant, which
    the interpreter runs too: rows wrapping inside a tile (3, 20) and across two (40)."""
    weight = fp4_weight(fmt, n, k)
    x = activations(m, k, dtype)
    cfg = Fp4GemmConfig(64, 64, min(32, block_m_for(m)), split_k, 4, 3, False, True)
    check(fp4_linear(x, *weight, config=cfg), x, weight)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize(("n", "k"), SMALL_SHAPES)
@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("fmt", FORMATS)
def test_gemv_matches_reference(fmt: str, m: int, n: int, k: int, split_k: int, dtype) -> None:
    """The CUDA-core kernel for 1-4 rows; K steps of 8 words (64 values) leave K tails (96,
    160)."""
    weight = fp4_weight(fmt, n, k)
    x = activations(m, k, dtype)
    check(fp4_linear(x, *weight, config=GemvConfig(64, 8, split_k)), x, weight)


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize(("n", "k"), SMALL_SHAPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_gemv_asm_scale_loads_match_reference(fmt: str, n: int, k: int, m: int) -> None:
    """Block scales read by inline-asm loads (masked lanes read a valid byte, unused)."""
    weight = fp4_weight(fmt, n, k)
    x = activations(m, k, torch.float32 if INTERPRETED else torch.bfloat16)
    cfg = GemvConfig(64, 8, 3, asm_scale_loads=True)
    check(fp4_linear(x, *weight, config=cfg), x, weight)


@NEEDS_PTX
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fmt", FORMATS)
def test_gemv_reads_16_bit_x_of_any_alignment_and_size(fmt: str, dtype, m: int) -> None:
    """The GEMV reads 16-bit x 16 bytes at a time and sums products in f16: rows that do not
    start on 16 bytes (copied first), fp16 as well as bf16, activations of order 2**8."""
    n, k = 200, 160
    weight = fp4_weight(fmt, n, k)
    x = (activations(m, k + 1, dtype) * 64)[:, 1:]
    assert x.data_ptr() % 16
    out = fp4_linear(x, *weight, config=GemvConfig(64, 8, 3))
    ref = x.float() @ dequantize_fp4(*weight).T
    torch.testing.assert_close(out.float(), ref, atol=64 * 2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "k"), [*SMALL_SHAPES, *LLAMA_SHAPES])
@pytest.mark.parametrize("m", [1, 16, 32, 64, 256, 1024])
@pytest.mark.parametrize("fmt", FORMATS)
def test_default_config(fmt: str, m: int, n: int, k: int, dtype) -> None:
    weight = fp4_weight(fmt, n, k)
    x = activations(m, k, dtype)
    check(fp4_linear(x, *weight), x, weight)


@pytest.mark.parametrize("fmt", FORMATS)
def test_bias_leading_dims_and_no_row_scale(fmt: str) -> None:
    packed, block, row = fp4_weight(fmt, 96, 128)
    bias = torch.linspace(-1, 1, 96, device=DEVICE)
    x = activations(6, 128, torch.float32)
    out = fp4_linear(x.view(2, 3, 128), packed, block, row, bias, small_config(6, 2))
    assert out.shape == (2, 3, 96)
    check(out.view(6, 96), x, (packed, block, row), bias)
    check(fp4_linear(x, packed, block, None, None, small_config(6, 1)), x, (packed, block, None))


def test_split_k_is_deterministic_and_leaves_counters_at_zero() -> None:
    weight = fp4_weight("nvfp4", 320, 1024)
    x = activations(5, 1024, torch.float32)
    cfg = small_config(5, 4)
    first = fp4_linear(x, *weight, config=cfg)
    for _ in range(3):
        assert torch.equal(fp4_linear(x, *weight, config=cfg), first)
    assert int(skinny_gemm._COUNTERS[x.device].abs().sum()) == 0
    check(first, x, weight)


def test_more_splits_than_k_tiles() -> None:
    weight = fp4_weight("mxfp4", 100, 128)  # 2 K tiles of 64 for 8 splits
    x = activations(20, 128, torch.float32)
    check(fp4_linear(x, *weight, config=small_config(20, 8)), x, weight)


def test_bad_shapes_are_refused() -> None:
    packed, block, row = fp4_weight("nvfp4", 64, 128)
    with pytest.raises(ValueError, match="do not fit"):
        fp4_linear(activations(2, 64, torch.float32), packed, block, row)
    with pytest.raises(ValueError, match="float8_e4m3fn or uint8"):
        fp4_linear(activations(2, 128, torch.float32), packed, block.float(), row)


@ON_GPU_ONLY
@pytest.mark.parametrize("m", [1, 3, 64, 256])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_candidate_config_on_a_llama_shape(fmt: str, m: int) -> None:
    weight = fp4_weight(fmt, 4096, 4096)
    x = activations(m, 4096, torch.bfloat16)
    for cfg in candidate_configs(m, 4096, 4096, num_sms=132):
        check(fp4_linear(x, *weight, config=cfg), x, weight)


@NEEDS_CUDA_GRAPHS
@pytest.mark.parametrize("fmt", FORMATS)
def test_replays_in_cuda_graph(fmt: str) -> None:
    """No host syncs: the launch captures, and the self-resetting counters keep replays right."""
    weight = fp4_weight(fmt, 4096, 4096)
    x = activations(16, 4096, torch.bfloat16)
    cfg = Fp4GemmConfig(64, 128, 16, 4, 4, 4)
    check_graph_replay(x, weight, cfg)
    check_graph_replay(x[:2], weight, GemvConfig(128, 32, 4))
    # decode steps past 128 rows dequantize in the graph; the dense weight is graph memory
    check_graph_replay(activations(200, 4096, torch.bfloat16), weight, DequantGemmConfig())


def check_graph_replay(x: torch.Tensor, weight: tuple, cfg) -> None:  # noqa: ANN001
    expected = fp4_linear(x, *weight, config=cfg)  # compiles and allocates the counters
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp4_linear(x, *weight, config=cfg)
    for _ in range(5):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected)
    check(out, x, weight)
