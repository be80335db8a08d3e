"""Logits of tiny random Llama/Qwen2/Qwen3 (and Qwen3-MoE, GLM-4.5-MoE, Mixtral) models through
kvserve's engine path (scheduler plan -> model inputs -> paged attention) against Hugging Face
transformers, float32."""

from __future__ import annotations

import pytest
import torch
from engine_checks import assert_engine_clean
from model_factory import MOE_TINY, load_reference_model

from kvserve.engine.config_builder import build_engine_config
from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.engine.engine_core import EngineCore
from kvserve.engine.runner.input_batch import build_model_inputs
from kvserve.models.forward_context import ForwardContext

VARIANTS = [
    ("LlamaForCausalLM", {}),
    ("LlamaForCausalLM", {"tie_word_embeddings": True, "rope_scaling": "llama3"}),
    ("LlamaForCausalLM", {"rope_scaling": "linear"}),
    ("Qwen2ForCausalLM", {"rope_scaling": "yarn"}),
    ("Qwen2ForCausalLM", {}),
    ("Qwen3ForCausalLM", {}),
    ("Qwen3MoeForCausalLM", MOE_TINY["Qwen3MoeForCausalLM"]),
    ("Glm4MoeForCausalLM", MOE_TINY["Glm4MoeForCausalLM"]),
    ("MixtralForCausalLM", MOE_TINY["MixtralForCausalLM"]),
]


def _step_logits(core: EngineCore) -> dict[str, torch.Tensor]:
    """Run one engine step by hand, returning the logits of every new row per request."""
    plan = core.scheduler.schedule()
    inputs = build_model_inputs(plan, core.runner.page_size, core.device)
    ctx = ForwardContext(inputs.meta, core.runner.kv, core.runner.backend)
    with torch.inference_mode():
        hidden = core.runner.model(inputs.token_ids, inputs.positions, ctx)
        logits = core.runner.model.compute_logits(hidden)
    out, row = {}, 0
    for chunk in plan.chunks:
        out[chunk.request.request_id] = logits[row : row + chunk.num_new_tokens]
        row += chunk.num_new_tokens
    greedy = {rid: int(v[-1].argmax()) for rid, v in out.items()}
    core.scheduler.update(plan, greedy)
    return out


@pytest.mark.parametrize(("arch", "overrides"), VARIANTS)
def test_prefill_and_decode_logits_match_transformers(arch, overrides, tiny_model_dir) -> None:
    path = tiny_model_dir(arch, **overrides)
    ref = load_reference_model(str(path))
    core = EngineCore(build_engine_config(str(path), device="cpu", max_total_tokens=4096))
    prompts = {"a": list(range(5, 42)), "b": list(range(300, 309)), "c": [7] * 20}
    for rid, ids in prompts.items():
        core.add_request(rid, ids, SamplingParams(temperature=0, max_tokens=6))
    seqs = {rid: list(ids) for rid, ids in prompts.items()}
    first = True
    while core.has_unfinished():
        step = _step_logits(core)
        for rid, logits in step.items():
            with torch.no_grad():
                full = ref(torch.tensor([seqs[rid]])).logits[0]
            expected = full if first else full[-1:]
            assert (logits - expected).abs().max().item() < 1e-3, (arch, rid)
            seqs[rid].append(int(logits[-1].argmax()))
        first = False
    assert_engine_clean(core)
