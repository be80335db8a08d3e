"""A GLM-4.5 shared expert held as one more expert of the stacks (``kvserve.layers.moe``): the
layer it makes, the routing column it adds, and outputs equal to the separate shared MLP's and
to transformers'. Each case builds the engine on CPU from a tiny random checkpoint."""

from __future__ import annotations

import pytest
import torch
from model_factory import MOE_TINY, hf_greedy

from kvserve import LLM, SamplingParams
from kvserve.errors import ConfigError
from kvserve.kernels.moe_routing import grouped_sigmoid_topk_reference, softmax_topk_reference
from kvserve.layers.moe import SHARED_EXPERT_FUSION_ENV, SparseMoE, shared_expert_fusion
from kvserve.quant.registry import same_expert_format
from kvserve.quant.schemes import QuantConfig

GLM = "Glm4MoeForCausalLM"
PROMPTS = [list(range(5, 36)), [7, 300, 1000, 42] * 6]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def _moe_layers(llm: LLM) -> list[SparseMoE]:
    return [m for m in llm.engine.runner.model.modules() if isinstance(m, SparseMoE)]


def _greedy(llm: LLM) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.fixture(scope="module")
def glm_dir(tiny_model_dir):  # noqa: ANN001, ANN201
    return tiny_model_dir(GLM, **MOE_TINY[GLM])


def test_the_shared_expert_is_stacked_and_decodes_as_the_separate_mlp(
    glm_dir, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    stacked = LLM(model=str(glm_dir), device="cpu", max_total_tokens=2048)
    layers = _moe_layers(stacked)
    assert layers and all(m.shared_expert and m.shared_experts is None for m in layers)
    experts = layers[0].cfg.num_experts
    assert layers[0].w13.shape[0] == layers[0].w2.shape[0] == experts + 1
    assert not any(m.missing() for m in layers)
    tokens = _greedy(stacked)

    monkeypatch.setenv(SHARED_EXPERT_FUSION_ENV, "0")
    separate = LLM(model=str(glm_dir), device="cpu", max_total_tokens=2048)
    assert all(m.shared_experts is not None for m in _moe_layers(separate))
    assert _moe_layers(separate)[0].w13.shape[0] == experts
    assert _greedy(separate) == tokens
    assert tokens[0] == hf_greedy(glm_dir, PROMPTS[0], GREEDY.max_tokens)


def test_a_shared_expert_of_another_size_stays_a_separate_mlp(tiny_model_dir) -> None:  # noqa: ANN001
    path = tiny_model_dir(GLM, **{**MOE_TINY[GLM], "n_shared_experts": 2})
    llm = LLM(model=str(path), device="cpu", max_total_tokens=2048)
    assert all(not m.shared_expert and m.shared_experts is not None for m in _moe_layers(llm))
    assert _greedy(llm)[1] == hf_greedy(path, PROMPTS[1], GREEDY.max_tokens)


@pytest.mark.parametrize("scoring", ["softmax", "grouped_sigmoid"])
def test_routing_adds_the_shared_expert_after_the_routed_ones(scoring: str) -> None:
    logits = torch.randn(5, 16, generator=torch.Generator().manual_seed(3))
    if scoring == "softmax":
        plain, shared = (softmax_topk_reference(logits, 4, True, s) for s in (False, True))
    else:
        args = (4, 4, 2, True, 2.5, None)
        plain, shared = (grouped_sigmoid_topk_reference(logits, *args, s) for s in (False, True))
    assert shared[1].shape == (5, 5) and shared[1].dtype == torch.int32
    assert torch.equal(shared[1][:, :4], plain[1]) and (shared[1][:, 4] == 16).all()
    assert torch.equal(shared[0][:, :4], plain[0]) and (shared[0][:, 4] == 1.0).all()


def test_the_fusion_switch_takes_0_or_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SHARED_EXPERT_FUSION_ENV, "yes")
    with pytest.raises(ConfigError, match="expected 0 or 1"):
        shared_expert_fusion()
    monkeypatch.delenv(SHARED_EXPERT_FUSION_ENV)
    assert shared_expert_fusion()


@pytest.mark.parametrize(
    ("ignore", "same"),
    [
        ((), True),  # both quantized
        (("re:.*mlp\\.experts.*", "re:.*shared_experts.*"), True),  # both left out
        (("re:.*shared_experts.*",), False),  # a checkpoint that keeps the shared expert bf16
        (("model.layers.1.mlp.experts",), False),  # experts left out, shared quantized
        (("re:.*shared_experts\\.down_proj",), False),  # one projection left out
    ],
)
def test_a_shared_expert_is_stacked_only_in_the_experts_format(
    ignore: tuple[str, ...], same: bool
) -> None:
    config = QuantConfig("fp8", "compressed-tensors", "test", ignore=ignore)
    prefix = "model.layers.1.mlp"
    assert same_expert_format(config, f"{prefix}.experts", f"{prefix}.shared_experts") == same
