"""RMSNorm writing e4m3 (``kernels.rmsnorm_fp8``) against the norm kernel followed by the
quantization kernel and against the torch reference; then, on a GPU, the FP8 method's steps on
its output against the unfused path (the engine with ``KVSERVE_FP8_NORM_QUANT`` at 1 against
0: ``test_fp8_engine.py``).

Bit for bit on a GPU: the kernel keeps the plain norm's row layout (8 values a thread), so its
fp32 sum of squares adds in the same order. With the layout Triton first picked for the e4m3
store (16 values a thread) 1 value of 65,536 at 64 x 1024 landed one e4m3 step apart (s56);
the sm_90 build test guards the layout (no shared-memory conversion).

``KVSERVE_TEST_DEVICE=cpu TRITON_INTERPRET=1 pytest --noconftest tests/gpu/test_rmsnorm_fp8.py``
runs the kernel cases through Triton's interpreter on a CPU.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

from kernel_test_device import BF16_UNLESS_INTERPRETED, DEVICE, INTERPRETED  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1] / "quant"))
from fp8_helpers import norm_quant  # noqa: E402

from kvserve.kernels.fp8_quant import FP8, launch_quant_kernel, quantize_fp8  # noqa: E402
from kvserve.kernels.rmsnorm import fused_add_rms_norm, rms_norm  # noqa: E402
from kvserve.kernels.rmsnorm_fp8 import rms_norm_fp8, rms_norm_fp8_reference  # noqa: E402
from kvserve.quant.fp8_activation import Fp8Activation  # noqa: E402
from kvserve.quant.fp8_config import Fp8Spec  # noqa: E402
from kvserve.quant.fp8_method import Fp8LinearMethod  # noqa: E402
from kvserve.quant.fp8_weights import quantize_weight  # noqa: E402

pytestmark = pytest.mark.gpu
ON_CUDA = pytest.mark.skipif(
    DEVICE.type != "cuda", reason="needs CUDA: dependent launch and the FP8 method's GPU kernels"
)
EPS = 1e-5
# (hidden, group, static): per token over a power-of-two row and over one that is not
# (640 = 5 x 128), per 128-column group (the tensor-core kernel's and the block scheme's),
# a static scale
CASES = [(256, None, False), (640, None, False), (640, 128, False), (256, 128, False),
         (384, None, True)]  # fmt: skip


def _inputs(rows: int, hidden: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(rows * 131 + hidden)
    x = (torch.randn(rows, hidden, generator=gen) * 3).to(dtype)
    residual = torch.randn(rows, hidden, generator=gen).to(dtype)
    weight = (torch.rand(hidden, generator=gen) + 0.5).to(dtype)
    return x.to(DEVICE), residual.to(DEVICE), weight.to(DEVICE)


def _bits(q: torch.Tensor) -> torch.Tensor:
    return q.view(torch.uint8)


def _assert_within_an_e4m3_step(
    q: torch.Tensor,
    scales: torch.Tensor,
    want_q: torch.Tensor,
    want_scales: torch.Tensor,
    norm_dtype: torch.dtype,
) -> None:
    """The same scales up to one step of a group's amax in the norm's 16-bit dtype, and the
    same e4m3 values but for a few (under 1%) one e4m3 step apart (1/8 relative, or a
    subnormal step)."""
    assert q.dtype == FP8 and q.shape == want_q.shape
    torch.testing.assert_close(scales, want_scales, rtol=torch.finfo(norm_dtype).eps, atol=0)
    close = torch.isclose(q.float(), want_q.float(), rtol=0.126, atol=2**-9)
    assert bool(close.all()) and float((_bits(q) != _bits(want_q)).float().mean()) < 0.01


@pytest.mark.parametrize("dtype", [torch.float16, BF16_UNLESS_INTERPRETED])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize(("hidden", "group", "static"), CASES)
@pytest.mark.parametrize("rows", [1, 7])
def test_matches_the_norm_then_the_quantization_kernel(
    rows: int, hidden: int, group: int | None, static: bool, with_residual: bool,
    dtype: torch.dtype,
) -> None:  # fmt: skip
    x, residual, weight = _inputs(rows, hidden, dtype)
    scale = torch.full((1,), 0.01, device=DEVICE) if static else None
    fused_residual = residual.clone() if with_residual else None
    q, scales = rms_norm_fp8(x, fused_residual, weight, EPS, group, scale)
    if with_residual:
        normed, summed = fused_add_rms_norm(x, residual, weight, EPS)
        assert torch.equal(fused_residual, summed)
    else:
        normed = rms_norm(x, weight, EPS)
    want_q, want_scales = launch_quant_kernel(normed, group, scale, False, False)
    assert torch.equal(_bits(q), _bits(want_q)) and torch.equal(scales, want_scales)
    expected_scales = (1,) if static else (rows, hidden // (group or hidden))
    assert tuple(scales.shape) == expected_scales


@pytest.mark.skipif(
    INTERPRETED, reason="the interpreter's e4m3 conversion drops a carry into the next power of 2"
)
@pytest.mark.parametrize(("hidden", "group", "static"), CASES)
def test_against_the_torch_reference(hidden: int, group: int | None, static: bool) -> None:
    """The reference's norm differs from the kernel's by fp32 sum order, which can move a value
    across an e4m3 rounding boundary: one e4m3 step (1/8 relative) at most, and rarely."""
    x, residual, weight = _inputs(9, hidden, torch.float16)
    scale = torch.full((1,), 0.01, device=DEVICE) if static else None
    ref_residual = residual.clone()
    q, scales = rms_norm_fp8(x, residual, weight, EPS, group, scale)
    ref_q, ref_scales = rms_norm_fp8_reference(x, ref_residual, weight, EPS, group, scale)
    assert torch.equal(residual, ref_residual)
    _assert_within_an_e4m3_step(q, scales, ref_q, ref_scales, torch.float16)


@pytest.mark.parametrize("rows", [1, 7])
@pytest.mark.parametrize("kernel", ["norm", "quantization"])
def test_scales_written_m_major_are_the_same_values(rows: int, kernel: str) -> None:
    """``scales_m_major`` (what cuBLASLt's block-scaled GEMM reads) changes the scales' strides
    to ``(1, rows)``, not their values or the e4m3 ones."""
    x, residual, weight = _inputs(rows, 640, torch.float16)
    if kernel == "norm":
        q, scales = rms_norm_fp8(x, residual.clone(), weight, EPS, 128)
        mq, m_scales = rms_norm_fp8(x, residual.clone(), weight, EPS, 128, scales_m_major=True)
    else:
        q, scales = launch_quant_kernel(x, 128, None, False, False)
        mq, m_scales = launch_quant_kernel(x, 128, None, False, False, scales_m_major=True)
    assert m_scales.shape == (rows, 5) and m_scales.stride() == (1, rows)
    assert torch.equal(_bits(q), _bits(mq)) and torch.equal(scales, m_scales)


def test_bad_groups_and_zero_rows() -> None:
    x, _, weight = _inputs(2, 384, torch.float16)
    with pytest.raises(ValueError, match="groups of 96"):
        rms_norm_fp8(x, None, weight, EPS, 96)  # not a power of two
    with pytest.raises(ValueError, match="groups of 256"):
        rms_norm_fp8(x, None, weight, EPS, 256)  # does not divide 384
    q, scales = rms_norm_fp8(x[:0], None, weight, EPS, 128)
    assert q.shape == (0, 384) and scales.shape == (0, 3)


@ON_CUDA
def test_launches_with_programmatic_dependent_launch() -> None:
    x, residual, weight = _inputs(5, 4096, torch.bfloat16)
    plain = rms_norm_fp8(x, residual.clone(), weight, EPS, 128)
    chained = rms_norm_fp8(x, residual.clone(), weight, EPS, 128, pdl=True)
    assert torch.equal(_bits(plain[0]), _bits(chained[0])) and torch.equal(plain[1], chained[1])


SPECS = [Fp8Spec("channel", "token"), Fp8Spec("tensor", "static"),
         Fp8Spec("block", "group", (128, 128)), Fp8Spec("channel", "tensor")]  # fmt: skip


@ON_CUDA
@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("rows", [1, 16, 33, 64, 65, 300])
def test_the_fp8_method_takes_the_input_its_scheme_names(spec: Fp8Spec, rows: int) -> None:
    """Where the method would quantize x by a kernel of its own (past 32 rows; past 64, not with
    a dynamic per-tensor scale, which needs x's whole amax) x quantized as its scheme says
    gives its output bit for bit, and the norm writes that x bit for bit; elsewhere,
    and with the switch at 0, it names no scheme."""
    hidden, n = 1024, 512
    x, residual, weight = _inputs(rows, hidden, torch.bfloat16)
    w = torch.randn(n, hidden, device=DEVICE) / hidden**0.5
    q, scale = quantize_weight(w, spec.weight, spec.block)
    layer = SimpleNamespace(
        weight=q,
        weight_scale=scale,
        launch_pdl=False,
        in_features=hidden,
        out_features=n,
        input_scale=torch.full((1,), 0.02, device=DEVICE),
    )
    method = Fp8LinearMethod(spec)
    with norm_quant("0"):
        assert method.fp8_input_scheme(layer, x) is None  # type: ignore[arg-type]
    with norm_quant("1"):
        scheme = method.fp8_input_scheme(layer, x)  # type: ignore[arg-type]
    if rows <= 32 or (rows > 64 and spec.activation == "tensor"):
        assert scheme is None
        return
    assert scheme is not None
    normed, _ = fused_add_rms_norm(x, residual.clone(), weight, EPS)
    want = method._matmul(layer, normed)  # type: ignore[arg-type]
    own_q, own_scales = quantize_fp8(normed, scheme.group, scheme.static_scale)
    quantized = Fp8Activation(own_q, own_scales, torch.bfloat16)
    assert torch.equal(method.apply_fp8(layer, quantized, None), want)  # type: ignore[arg-type]
    xq, xs = rms_norm_fp8(x, residual.clone(), weight, EPS, scheme.group, scheme.static_scale)
    assert torch.equal(_bits(xq), _bits(own_q)) and torch.equal(xs, own_scales)
