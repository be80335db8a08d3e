"""The bundled SmolLM2 quantized online to FP8 on CPU (``quantization="fp8"``): every linear
layer holds float8_e4m3fn weights, it answers sensibly, and its greedy tokens agree with the
unquantized model's (teacher-forced top-1 agreement, benchmarks/lowbit_agreement.py)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.lowbit_agreement import reference_continuations, top1_agreement
from kvserve import LLM, SamplingParams
from kvserve.layers.linear import Linear

MIN_AGREEMENT = 0.75  # measured 0.875 (benchmarks/results/lowbit_agreement_cpu_fp8_*.json)


@pytest.fixture(scope="module")
def fp8_llm() -> LLM:
    return LLM(device="cpu", quantization="fp8")


def test_online_fp8_quantizes_every_linear_layer(fp8_llm: LLM) -> None:
    layers = [m for m in fp8_llm.engine.runner.model.modules() if isinstance(m, Linear)]
    assert len(layers) == 4 * fp8_llm.engine.model_config.num_layers
    assert all(m.weight.dtype == torch.float8_e4m3fn for m in layers)
    assert all(m.weight_scale.shape == (m.out_features,) for m in layers)  # per channel


def test_online_fp8_answers_sensibly(fp8_llm: LLM) -> None:
    out = fp8_llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=8))
    assert "Paris" in out[0].text


def test_online_fp8_greedy_agrees_with_unquantized(fp8_llm: LLM, bundled_llm: LLM) -> None:
    refs = reference_continuations(bundled_llm, 12)
    assert top1_agreement(fp8_llm, refs) >= MIN_AGREEMENT
