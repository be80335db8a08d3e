"""The Triton kernels that put x's columns in the asynchronous FP4 GEMM's K-step permutation
(``fp4_x_permute``, and the RMSNorm and SiLU-mul writing their output in it) against the torch
reference (``fp4_step_order.permute_x_steps``), for both W decodes' permutations; and the GEMM
with it. Runs under Triton's interpreter too (not bf16)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernel_test_device import BF16_UNLESS_INTERPRETED, DEVICE, INTERPRETED  # noqa: E402

from kvserve.kernels.activation import silu_and_mul  # noqa: E402
from kvserve.kernels.fp4_step_order import permute_x_steps  # noqa: E402
from kvserve.kernels.fp4_x_permute import permute_x_steps_triton  # noqa: E402
from kvserve.kernels.rmsnorm import fused_add_rms_norm, rms_norm  # noqa: E402

pytestmark = pytest.mark.gpu
_PRODUCER_DTYPE = torch.float32 if INTERPRETED else torch.bfloat16  # numpy has no bf16


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, BF16_UNLESS_INTERPRETED])
@pytest.mark.parametrize("bits", [False, True])
@pytest.mark.parametrize(("m", "k"), [(1, 128), (5, 384), (64, 4096), (17, 2176), (3, 14336)])
def test_matches_the_torch_permutation(m: int, k: int, bits: bool, dtype: torch.dtype) -> None:
    """K of one step to 112 (Llama-3-8B's down), K past the program's 2048-column block and not
    a multiple of it (2176, 14336 = 7 blocks); every column is a distinct value, so a wrong or
    missed column shows."""
    x = torch.arange(m * k, device=DEVICE).reshape(m, k)
    x = (x if dtype == torch.float32 else x % 2039).to(dtype)  # finite in 16 bits
    got = permute_x_steps_triton(x, bits)
    assert got.is_contiguous()
    assert torch.equal(got, permute_x_steps(x, bits))


def test_takes_rows_of_a_wider_tensor_and_refuses_partial_steps() -> None:
    wide = torch.randn(6, 512 + 64, device=DEVICE)
    x = wide[:, 64:]  # row stride 576
    assert torch.equal(permute_x_steps_triton(x, True), permute_x_steps(x.contiguous(), True))
    assert permute_x_steps_triton(wide[:0, :512]).shape == (0, 512)
    with pytest.raises(ValueError, match="multiple of 128"):
        permute_x_steps_triton(torch.zeros(2, 200, device=DEVICE))


@pytest.mark.parametrize("bits", [False, True])
@pytest.mark.parametrize(("m", "k"), [(1, 128), (3, 4096), (17, 1152)])
def test_the_norm_writes_its_output_permuted(m: int, k: int, bits: bool) -> None:
    """The plain and the residual-adding RMSNorm: the normed output in the step order, the
    residual sum in natural order; the same values as the norm then the permutation."""
    dtype = _PRODUCER_DTYPE
    x, residual = torch.randn(2, m, k, device=DEVICE).to(dtype)
    weight = torch.rand(k, device=DEVICE).to(dtype)
    got = rms_norm(x, weight, 1e-6, step_order=bits)
    assert torch.equal(got, permute_x_steps(rms_norm(x, weight, 1e-6), bits))
    res_plain, res_permuted = residual.clone(), residual.clone()
    want, _ = fused_add_rms_norm(x, res_plain, weight, 1e-6)
    got, summed = fused_add_rms_norm(x, res_permuted, weight, 1e-6, step_order=bits)
    assert torch.equal(got, permute_x_steps(want, bits))
    assert torch.equal(summed, res_plain)


@pytest.mark.parametrize("bits", [False, True])
@pytest.mark.parametrize(("m", "inter"), [(2, 128), (5, 1408), (33, 2048)])
def test_the_silu_mul_writes_its_output_permuted(m: int, inter: int, bits: bool) -> None:
    """K past the kernel's 1,024-column block and not a multiple of it (1,408)."""
    gate_up = torch.randn(m, 2 * inter, device=DEVICE).to(_PRODUCER_DTYPE)
    got = silu_and_mul(gate_up, step_order=bits)
    assert torch.equal(got, permute_x_steps(silu_and_mul(gate_up), bits))


def test_producers_refuse_partial_steps() -> None:
    with pytest.raises(ValueError, match="multiple of 128"):
        rms_norm(torch.ones(2, 200, device=DEVICE), torch.ones(200, device=DEVICE), 1e-6,
                 step_order=True)  # fmt: skip
    with pytest.raises(ValueError, match="multiple of 128"):
        silu_and_mul(torch.ones(2, 400, device=DEVICE), step_order=False)


@pytest.mark.parametrize("bits", [False, True])
def test_x_in_a_step_order_is_refused_where_the_async_gemm_does_not_take_it(bits: bool) -> None:
    """Four rows go to the GEMV (and off Hopper every step to the Triton kernels): x in a step
    order there would multiply permuted columns by natural ones, so ``fp4_linear`` refuses it."""
    from test_fp4_gemm import activations, fp4_weight

    from kvserve.kernels.fp4_gemm import fp4_linear

    x = activations(4, 256, _PRODUCER_DTYPE)
    with pytest.raises(ValueError, match=f"step order of bits={bits}"):
        fp4_linear(x, *fp4_weight("nvfp4", 128, 256), x_step_order=bits)


@pytest.mark.skipif(
    INTERPRETED
    or DEVICE.type != "cuda"
    or not torch.cuda.is_available()
    or torch.cuda.get_device_capability()[0] != 9,
    reason="the asynchronous-MMA FP4 GEMM (Gluon) needs a Hopper GPU",
)
@pytest.mark.parametrize("bits", [False, True])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_the_async_gemm_with_it_gives_the_same_result(fmt: str, bits: bool) -> None:
    from test_fp4_gemm import activations, fp4_weight

    from kvserve.kernels.fp4_async_gemm import fp4_async_linear

    weight = fp4_weight(fmt, 512, 1152)
    x = activations(40, 1152, torch.bfloat16)
    want = fp4_async_linear(x, *weight, split_k=3, bits=bits)
    got = fp4_async_linear(x, *weight, split_k=3, bits=bits, triton_permute=False)
    assert torch.equal(got, want)
    # x written in the step order by its producer: no permutation in the GEMM
    norm_weight = torch.rand(1152, device=DEVICE, dtype=torch.bfloat16)
    want = fp4_async_linear(rms_norm(x, norm_weight, 1e-6), *weight, split_k=3, bits=bits)
    permuted = rms_norm(x, norm_weight, 1e-6, step_order=bits)
    got = fp4_async_linear(permuted, *weight, split_k=3, bits=bits, x_permuted=True)
    assert torch.equal(got, want)
