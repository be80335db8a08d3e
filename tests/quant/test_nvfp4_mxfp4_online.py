"""The bundled SmolLM2 quantized online to NVFP4 and MXFP4 on CPU (``quantization="nvfp4"``):
every linear layer holds packed E2M1 weights, it answers sensibly, and its greedy tokens agree
with the unquantized model's (teacher-forced top-1 agreement, benchmarks/lowbit_agreement.py)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.lowbit_agreement import reference_continuations, top1_agreement
from kvserve import LLM, SamplingParams
from kvserve.layers.linear import Linear

# measured over 16 tokens (benchmarks/results/lowbit_agreement_cpu_nvfp4-mxfp4_2026-11-30.json):
# nvfp4 0.781, mxfp4 0.648 (fp8: 0.875)
MIN_AGREEMENT = {"nvfp4": 0.6, "mxfp4": 0.45}


@pytest.fixture(scope="module", params=["nvfp4", "mxfp4"])
def fp4_llm(request: pytest.FixtureRequest) -> LLM:
    return LLM(device="cpu", quantization=request.param)


def test_online_fp4_packs_every_linear_layer(fp4_llm: LLM) -> None:
    layers = [m for m in fp4_llm.engine.runner.model.modules() if isinstance(m, Linear)]
    assert len(layers) == 4 * fp4_llm.engine.model_config.num_layers
    for m in layers:
        assert m.weight_packed.dtype == torch.uint8
        assert m.weight_packed.shape == (m.out_features, m.in_features // 2)


def test_online_fp4_answers_sensibly(fp4_llm: LLM) -> None:
    """A 4-bit 135M model loses facts first ("The capital of France is" 123,222 square
    kilometers, for NVFP4) but keeps easy patterns."""
    out = fp4_llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=8))
    assert "5, 6, 7" in out[0].text


def test_online_fp4_greedy_agrees_with_unquantized(fp4_llm: LLM, bundled_llm: LLM) -> None:
    scheme = fp4_llm.config.quantization
    refs = reference_continuations(bundled_llm, 12)
    assert top1_agreement(fp4_llm, refs) >= MIN_AGREEMENT[scheme]
