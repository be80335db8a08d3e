"""FP4 checkpoints written by the real tools (tests/fixtures/quant/make_fp4_fixtures.py) load
through kvserve's engine path and give the logits of the same tool's dequantized model.

Tolerances (float32 logits of magnitude ~3): 1e-4 where the tool dequantizes in fp32 (ModelOpt's
NVFP4QTensor, gpt-oss's converter; compressed-tensors' MXFP4, whose power-of-two scales are
exact in bf16); 5e-2 for compressed-tensors' NVFP4, which dequantizes in bf16 (it divides by
the global scale there), so its reference weights carry bf16 rounding (observed: 0.019).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from kvserve.engine.config_builder import build_engine_config
from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.engine.engine_core import EngineCore
from kvserve.engine.runner.input_batch import build_model_inputs
from kvserve.models.forward_context import ForwardContext

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "quant"
CASES = [
    ("nvfp4_ct", "nvfp4", "compressed-tensors", 5e-2),
    ("mxfp4_ct", "mxfp4", "compressed-tensors", 1e-4),
    ("nvfp4_modelopt", "nvfp4", "modelopt", 1e-4),
    ("mxfp4_gptoss", "mxfp4", "mxfp4", 1e-4),
]


def prefill_logits(core: EngineCore, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Logits of every prompt position, from one prefill step run by hand."""
    for i, ids in enumerate(prompts):
        core.add_request(str(i), ids, SamplingParams(temperature=0, max_tokens=1))
    plan = core.scheduler.schedule()
    inputs = build_model_inputs(plan, core.runner.page_size, core.device)
    ctx = ForwardContext(inputs.meta, core.runner.kv, core.runner.backend)
    with torch.inference_mode():
        logits = core.runner.model.compute_logits(
            core.runner.model(inputs.token_ids, inputs.positions, ctx)
        )
    out, row = {}, 0
    for chunk in plan.chunks:
        out[chunk.request.request_id] = logits[row : row + chunk.num_new_tokens]
        row += chunk.num_new_tokens
    return [out[str(i)] for i in range(len(prompts))]


@pytest.mark.parametrize(("name", "scheme", "layout", "tol"), CASES)
def test_tool_checkpoint_gives_the_tools_logits(name: str, scheme: str, layout: str, tol: float):
    reference = load_file(str(FIXTURES / f"{name}_reference.safetensors"))
    config = build_engine_config(str(FIXTURES / name), device="cpu", max_total_tokens=1024)
    core = EngineCore(config)
    linear = core.runner.model.model.layers[0].mlp.gate_up_proj
    assert (type(linear.method).__name__, linear.method.layout) == ("Fp4LinearMethod", layout)
    assert linear.method.format.name == scheme and linear.weight_packed.dtype == torch.uint8
    ours = prefill_logits(core, reference["input_ids"].tolist())
    for got, expected in zip(ours, reference["logits"], strict=True):
        assert (got - expected).abs().max().item() < tol
        assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_gptoss_layout_leaves_attention_unquantized() -> None:
    """Its modules_to_not_convert names model.layers.*.self_attn, as gpt-oss's does."""
    core = EngineCore(build_engine_config(str(FIXTURES / "mxfp4_gptoss"), device="cpu"))
    attention = core.runner.model.model.layers[1].self_attn
    assert type(attention.qkv_proj.method).__name__ == "UnquantizedLinearMethod"
    assert type(attention.o_proj.method).__name__ == "UnquantizedLinearMethod"
