"""``KVSERVE_FP8_NORM_QUANT=1``: the RMSNorm before an FP8 q/k/v or gate/up layer writes the
e4m3 input that layer's step would otherwise quantize by a kernel of its own. On the CPU
reference every FP8 step quantizes x that way, so the llmcompressor fixtures (per-token,
128-group and static activation scales) and a MoE one run the engine's own prefill and decode
with the switch on and off: the same logits, bit for bit, with fewer quantization launches.
The kernel and the GPU paths are in ``tests/gpu/test_rmsnorm_fp8.py``."""

from __future__ import annotations

import pytest
import torch
from fp8_helpers import FIXTURES, cpu_engine, norm_quant, step_logits

from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.kernels.fp8_quant import quantize_fp8_reference
from kvserve.kernels.rmsnorm import fused_add_rms_norm_reference
from kvserve.layers.linear import Linear
from kvserve.layers.norm import RMSNorm
from kvserve.models.decoder import MLP
from kvserve.quant import fp8_method
from kvserve.quant.fp8_activation import Fp8Activation, Fp8InputScheme

PROMPT = list(range(3, 60)) + [200, 17, 17, 90]


def _run(layout: str, monkeypatch: pytest.MonkeyPatch) -> tuple[list[torch.Tensor], int]:
    """Prefill logits, then two decode steps' logits, and how many times the FP8 method ran
    its activation quantization kernel."""
    launches = 0
    real = fp8_method.quantize_fp8

    def counted(*args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        nonlocal launches
        launches += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(fp8_method, "quantize_fp8", counted)
    core = cpu_engine(FIXTURES / layout)
    core.add_request("r", PROMPT, SamplingParams(temperature=0, max_tokens=3))
    logits = []
    for _ in range(3):  # the prefill, then two decode steps
        plan, step = step_logits(core)
        core.scheduler.update(plan, {"r": int(step[-1].argmax())})
        logits.append(step)
    monkeypatch.setattr(fp8_method, "quantize_fp8", real)
    return logits, launches


@pytest.mark.parametrize("layout", ["fp8_dynamic", "fp8_block", "fp8_static", "moe_fp8_block"])
def test_the_norm_quantizes_for_the_fp8_layer_it_feeds(
    layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dense layers: both norms (q/k/v and gate/up); MoE layers (the fixture's second): the
    input norm only (the router takes the post-attention norm's 16-bit output)."""
    with norm_quant("0"):
        plain, plain_launches = _run(layout, monkeypatch)
    with norm_quant("1"):
        fused, fused_launches = _run(layout, monkeypatch)
    for a, b in zip(plain, fused, strict=True):
        assert torch.equal(a, b)
    layers = cpu_engine(FIXTURES / layout).runner.model.model.layers
    norms_feeding_fp8 = sum(1 + isinstance(layer.mlp, MLP) for layer in layers)
    assert norms_feeding_fp8 == (3 if layout.startswith("moe") else 2)
    assert plain_launches - fused_launches == len(plain) * norms_feeding_fp8


SCHEMES = [Fp8InputScheme(None), Fp8InputScheme(32), Fp8InputScheme(32, scales_m_major=True)]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_norm_layer_returns_the_quantized_norm_and_the_residual_sum(
    scheme: Fp8InputScheme,
) -> None:
    """The scales in the layout the scheme names: row-major, or M-major (strides (1, rows):
    cuBLASLt's block-scaled GEMM) with the same values."""
    gen = torch.Generator().manual_seed(3)
    x, residual = torch.randn(5, 64, generator=gen), torch.randn(5, 64, generator=gen)
    norm = RMSNorm(64, 1e-6, torch.float32)
    norm.weight.data.uniform_(0.5, 1.5, generator=gen)
    normed, summed = fused_add_rms_norm_reference(x, residual.clone(), norm.weight, 1e-6)
    out, new_residual = norm.forward_fp8(x, residual, scheme)
    q, scales = quantize_fp8_reference(normed, scheme.group)
    assert isinstance(out, Fp8Activation) and out.dtype == torch.float32
    assert torch.equal(out.q.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(out.scales, scales)
    assert out.scales.stride() == ((1, 5) if scheme.scales_m_major else scales.stride())
    assert new_residual is residual and torch.equal(residual, summed)
    first, kept = norm.forward_fp8(x, None, scheme)
    assert kept is x and first.q.shape == (5, 64)


def test_methods_that_take_16_bit_input_name_no_scheme_and_refuse_e4m3() -> None:
    layer = Linear(64, [32], False, torch.float32)
    x = torch.randn(3, 64)
    assert layer.fp8_input_scheme(x) is None
    q = Fp8Activation(torch.zeros(3, 64, dtype=torch.float8_e4m3fn), torch.ones(3, 1), x.dtype)
    with pytest.raises(TypeError, match="UnquantizedLinearMethod takes no pre-quantized FP8"):
        layer(q)
