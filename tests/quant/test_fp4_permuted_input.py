"""``KVSERVE_FP4_PERMUTE_IN_PRODUCER``'s seam on the CPU: the norm layer's permuted output and
which methods name a step order. Only the FP4 method on a Hopper GPU names one (where the
asynchronous GEMM takes the step), so the engine paths and the kernels are tested on the GPU:
``tests/gpu/test_fp4_engine.py`` and ``tests/gpu/test_fp4_x_permute.py``."""

from __future__ import annotations

import pytest
import torch

from kvserve.kernels.fp4_step_order import permute_x_steps
from kvserve.kernels.rmsnorm import fused_add_rms_norm_reference, rms_norm_reference
from kvserve.layers.linear import Linear
from kvserve.layers.norm import RMSNorm
from kvserve.quant.permuted_activation import PermutedActivation
from kvserve.quant.registry import linear_method, resolve


@pytest.mark.parametrize("bits", [False, True])
def test_the_norm_layer_returns_the_permuted_norm_and_the_residual_sum(bits: bool) -> None:
    gen = torch.Generator().manual_seed(5)
    x, residual = torch.randn(3, 256, generator=gen), torch.randn(3, 256, generator=gen)
    norm = RMSNorm(256, 1e-6, torch.float32)
    norm.weight.data.uniform_(0.5, 1.5, generator=gen)
    normed, summed = fused_add_rms_norm_reference(x, residual.clone(), norm.weight, 1e-6)
    out, new_residual = norm.forward_permuted(x, residual, bits)
    assert isinstance(out, PermutedActivation) and out.bits is bits
    assert torch.equal(out.values, permute_x_steps(normed, bits))
    assert not torch.equal(out.values, normed)  # a permutation that moves columns
    assert torch.equal(new_residual, summed)
    first, kept = norm.forward_permuted(x, None, bits)
    assert kept is x
    assert torch.equal(
        first.values, permute_x_steps(rms_norm_reference(x, norm.weight, 1e-6), bits)
    )


@pytest.mark.parametrize("scheme", ["none", "fp8", "nvfp4", "mxfp4"])
def test_no_method_names_a_step_order_off_hopper(scheme: str) -> None:
    """On the CPU every method takes x as it comes: the norm writes it in natural order, and
    the FP4 method folds no SiLU-mul; a method that never names an order refuses one."""
    config = resolve(None, scheme) if scheme != "none" else resolve(None, None)
    layer = Linear(256, [128], False, torch.float32, linear_method(config, ["m"]), "m")
    layer.init_dummy(torch.Generator().manual_seed(0))
    x = torch.randn(40, 256)
    assert layer.step_order(x) is None
    if scheme.endswith("fp4"):
        assert layer.forward_after_silu_mul(torch.randn(40, 512)) is None
    if scheme in ("none", "fp8"):
        with pytest.raises(TypeError, match="takes no input in the FP4 GEMM's step order"):
            layer(PermutedActivation(x, True))
