"""Tensor parallelism on CPU (gloo): TP=2 (3 for the bundled model, whose 9 heads do not split
in two) gives TP=1's greedy tokens, near-ties tolerated and counted, through chunked prefill,
prefix-cache hits, preemption and overlap scheduling (pending rows filled on every rank); also
with weights quantized to FP8 at load (each rank quantizes its own slice), and for the
mixture-of-experts families (experts split along their intermediate size)."""

from __future__ import annotations

import os

import pytest
from model_factory import MOE_TINY

from kvserve.errors import ConfigError
from tests.distributed.tp_scenario import Run, compare, run_workload
from tests.quant.fp8_helpers import norm_quant

TINY = {  # name: (architecture, config overrides, engine settings)
    "llama": ("LlamaForCausalLM", {}, {}),
    "qwen2-tied": ("Qwen2ForCausalLM", {"tie_word_embeddings": True}, {}),  # qkv bias, tied head
    "qwen3-one-kv-head": ("Qwen3ForCausalLM", {"num_key_value_heads": 1}, {}),  # KV replicated
    "llama-online-fp8": ("LlamaForCausalLM", {}, {"quantization": "fp8"}),
    # experts split along their intermediate size; GLM adds a shared expert and q/k/v biases
    "qwen3-moe": ("Qwen3MoeForCausalLM", MOE_TINY["Qwen3MoeForCausalLM"], {}),
    "glm4-moe": ("Glm4MoeForCausalLM", MOE_TINY["Glm4MoeForCausalLM"], {}),
    "mixtral": ("MixtralForCausalLM", MOE_TINY["MixtralForCausalLM"], {}),
}


def _check(model: str, tp: int, **settings: object) -> None:
    reference = run_workload(model, 1, **settings)
    parallel = run_workload(model, tp, overlap_schedule=True, **settings)
    ties, diffs = compare(reference, parallel)
    print(f"tp {tp}: {ties} near-ties over {len(reference.tokens)} requests")
    assert diffs == []
    assert ties <= len(reference.tokens) // 2  # at least half are compared to their end
    assert parallel.preemptions > 0 and parallel.prefix_hits > 0
    assert len(parallel.tokens) == 5


@pytest.mark.parametrize("name", list(TINY))
def test_tiny_models_tp2_match_tp1(tiny_model_dir, name: str) -> None:
    arch, overrides, settings = TINY[name]
    _check(str(tiny_model_dir(arch, **overrides)), 2, **settings)


def test_fp8_norms_writing_e4m3_under_tp2_match_tp1(tiny_model_dir) -> None:
    """``KVSERVE_FP8_NORM_QUANT=1`` (read by every rank's process): each rank's norms write
    the e4m3 input of its column-parallel q/k/v and gate/up shards."""
    with norm_quant("1"):
        _check(str(tiny_model_dir("LlamaForCausalLM")), 2, quantization="fp8")


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("KVSERVE_TP_SLOW_TESTS"),
    reason="three loads of the bundled GGUF (~1-3 min on 2 cores): set KVSERVE_TP_SLOW_TESTS=1",
)
def test_bundled_model_tp3_matches_tp1(bundled_llm, bundled_path: str) -> None:
    """The bundled GGUF (Q4_1 dequantized on load, tied embeddings, 9 heads / 3 KV heads) on
    3 ranks against the session's TP=1 engine: its cost is three model loads, so it runs a
    short plain workload only."""
    from kvserve import LLM, SamplingParams

    prompts = ["The capital of France is", "def fibonacci(n):"]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2)
    reference = Run()
    for i, out in enumerate(bundled_llm.generate(prompts, params)):
        reference.tokens[str(i)] = out.token_ids
        reference.margins[str(i)] = [lp.top[0][1] - lp.top[1][1] for lp in out.outputs[0].logprobs]
    llm = LLM(bundled_path, tp=3, device="cpu", overlap_schedule=True)
    try:
        parallel = Run(
            tokens={str(i): o.token_ids for i, o in enumerate(llm.generate(prompts, params))}
        )
    finally:
        llm.engine.close()
    ties, diffs = compare(reference, parallel)
    print(f"tp 3: {ties} near-ties")
    assert diffs == [] and ties < len(prompts)


def test_a_tp_that_does_not_split_the_heads_is_refused(bundled_path: str) -> None:
    with pytest.raises(ConfigError, match="9 attention heads do not split"):
        run_workload(bundled_path, 2)
