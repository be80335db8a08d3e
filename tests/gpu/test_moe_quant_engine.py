"""Quantized mixture-of-experts models in the engine on a GPU: the llmcompressor Qwen3-MoE
checkpoints (FP8 block, FP8 per-channel, NVFP4; tests/fixtures/quant) through the fused
Triton experts give the CPU reference path's logits; online nvfp4 / mxfp4 / fp8 and dummy
GLM-shaped weights run under CUDA graphs and give the tokens eager runs give."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from kvserve.engine.config_builder import build_engine_config
from kvserve.engine.engine_core import EngineCore

pytestmark = pytest.mark.gpu
pytest.importorskip("triton")

from test_engine_gpu import _greedy  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1] / "quant"))
from fp8_helpers import FIXTURES, cpu_engine, prefill_logits  # noqa: E402

PROMPT = list(range(3, 60)) + [200, 17, 17, 90]
# NVFP4 is weight-only (fp32 activations here, so only summation order differs). With FP8
# activations, any difference in summation order flips some FP8 roundings, and this random
# model is sensitive to them: quantizing its activations at all moves its logits by 7-8% of
# the largest on the CPU (tests/quant/test_moe_checkpoints.py); the GPU must stay within that.
# (0.05 failed for both FP8 layouts on the H200 at 1315e9d; 0.1 is not yet checked there.)
TOLERANCE = {"moe_fp8_block": 0.1, "moe_fp8_dynamic": 0.1, "moe_nvfp4": 1e-3}


def _gpu(path: str | Path, **settings: object) -> EngineCore:
    base = {"device": "cuda", "dtype": "float32", "max_total_tokens": 4096}
    return EngineCore(build_engine_config(str(path), **{**base, **settings}))


@pytest.mark.parametrize("layout", sorted(TOLERANCE))
def test_moe_checkpoint_gpu_logits_match_the_cpu_reference(layout: str) -> None:
    if layout.startswith("moe_fp8") and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 tensor cores need sm_89+")
    gpu = prefill_logits(_gpu(FIXTURES / layout), PROMPT).cpu()
    cpu = prefill_logits(cpu_engine(FIXTURES / layout), PROMPT)
    err = (gpu - cpu).abs().max() / cpu.abs().max()
    assert err < TOLERANCE[layout], err
    assert (gpu.argmax(-1) == cpu.argmax(-1)).float().mean() >= 0.85


def _dummy_glm(tmp_path: Path, quantization_config: dict | None) -> str:
    config = {
        "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "hidden_size": 256,
        "intermediate_size": 512, "moe_intermediate_size": 128, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "partial_rotary_factor": 0.5, "attention_bias": True, "n_routed_experts": 16,
        "n_shared_experts": 1, "num_experts_per_tok": 4, "first_k_dense_replace": 1,
        "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 1.0,
        "vocab_size": 1024, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": False, "eos_token_id": 0,
    }  # fmt: skip
    if quantization_config:
        config["quantization_config"] = quantization_config
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


BLOCK_FP8 = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
CASES = {
    "fp8-block": (BLOCK_FP8, None),
    "fp8-online": (None, "fp8"),
    "nvfp4-online": (None, "nvfp4"),
    "mxfp4-online": (None, "mxfp4"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_quantized_moe_graphs_match_eager(case: str, tmp_path) -> None:  # noqa: ANN001
    if case.startswith("fp8") and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 tensor cores need sm_89+")
    qc, flag = CASES[case]
    path = _dummy_glm(tmp_path, qc)
    settings = {"dtype": "float32", "load_format": "dummy", "max_total_tokens": 8192}
    if flag:
        settings["quantization"] = flag
    graphs = _gpu(path, **settings)
    eager = _gpu(path, enforce_eager=True, **settings)
    assert graphs.runner.graphs is not None
    moe = next(m for m in graphs.runner.model.modules() if type(m).__name__ == "SparseMoE")
    assert moe.w13.dtype in (torch.float8_e4m3fn, torch.uint8)
    assert _greedy(graphs, 12) == _greedy(eager, 12)
