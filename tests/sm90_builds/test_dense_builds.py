"""A dense layer's other kernels built for sm_90 as a step launches them: the RMSNorm (with and
without the residual add) at Llama-3-8B's, Qwen3-30B-A3B's and GLM-4.5-Air's widths and
gpt-oss's 2880, the SiLU-mul, x's FP8 quantization per token, per 128-column group and static,
and the FP8 block-scaled GEMM of prefill steps."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from triton_target import stack_bytes  # noqa: E402

from kvserve.kernels.activation import silu_and_mul  # noqa: E402
from kvserve.kernels.fp8_gemm import fp8_block_gemm  # noqa: E402
from kvserve.kernels.fp8_quant import FP8, launch_quant_kernel  # noqa: E402
from kvserve.kernels.rmsnorm import fused_add_rms_norm, rms_norm  # noqa: E402


@pytest.mark.parametrize("hidden", [4096, 2048, 2880])
@pytest.mark.parametrize("tokens", [1, 512])
def test_the_norms_and_the_silu_mul_build_for_sm90_without_spills(
    compile_only: list, hidden: int, tokens: int
) -> None:
    """Where K is whole 128-column steps (not 2880), each also writing its output in the async
    FP4 GEMM's step order."""
    x = torch.zeros(tokens, hidden, dtype=torch.bfloat16)
    weight = torch.ones(hidden, dtype=torch.bfloat16)
    gate_up = torch.zeros(tokens, 2 * 3 * hidden, dtype=torch.bfloat16)
    for step_order in (None, True) if hidden % 128 == 0 else (None,):
        rms_norm(x, weight, 1e-6, pdl=True, step_order=step_order)
        fused_add_rms_norm(x, x.clone(), weight, 1e-6, pdl=True, step_order=step_order)
        silu_and_mul(gate_up, pdl=True, step_order=step_order)
    assert stack_bytes(compile_only) == [0] * len(compile_only)


@pytest.mark.parametrize("scheme", ["per-token", "group-128", "static"])
@pytest.mark.parametrize("columns", [4096, 14336])
def test_the_fp8_quantization_builds_for_sm90_without_spills(
    compile_only: list, scheme: str, columns: int
) -> None:
    x = torch.zeros(8, columns, dtype=torch.bfloat16)
    static = torch.ones(1) if scheme == "static" else None
    launch_quant_kernel(x, 128 if scheme == "group-128" else None, static, pdl=True, gated=False)
    assert stack_bytes(compile_only) == [0] * len(compile_only)


@pytest.mark.parametrize("scales", ["row-major", "m-major"])
@pytest.mark.parametrize("tokens", [65, 512, 8192])
def test_the_fp8_block_gemm_builds_for_sm90_without_spills(
    compile_only: list, tokens: int, scales: str
) -> None:
    """Block-scaled FP8 past the tensor-core decode kernel's 64 rows: x per 128-column group
    (its scales row-major, or M-major as written for cuBLASLt), W per 128 x 128 block (Qwen3's
    and DeepSeek's FP8 releases)."""
    n, k = 6144, 4096
    xq = torch.zeros(tokens, k, dtype=FP8)
    w = torch.zeros(n, k, dtype=FP8)
    xs = torch.ones(tokens, k // 128)
    xs = xs.t().contiguous().t() if scales == "m-major" else xs
    fp8_block_gemm(xq, xs, w, torch.ones(n // 128, k // 128), (128, 128), torch.bfloat16)
    assert stack_bytes(compile_only) == [0] * len(compile_only)
