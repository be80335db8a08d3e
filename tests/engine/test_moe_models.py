"""Mixture-of-experts models (Qwen3-MoE, GLM-4.5-MoE, Mixtral): config normalisation, the expert
sorting behind the fused kernel, and greedy outputs that engine settings must not change.
Logits against transformers are in test_tiny_models_vs_hf.py (same variants)."""

from __future__ import annotations

import json

import pytest
import torch
from engine_checks import assert_engine_clean
from model_factory import MOE_TINY, hf_greedy

from kvserve import LLM, SamplingParams
from kvserve.config import MoEConfig
from kvserve.kernels.fused_moe import fused_moe_reference, sort_slots_by_expert
from kvserve.loader.hf_config import read_hf_config

ARCHS = sorted(MOE_TINY)


@pytest.fixture(scope="module", params=ARCHS)
def moe_dir(request, tiny_model_dir):  # noqa: ANN001, ANN201
    return request.param, tiny_model_dir(request.param, **MOE_TINY[request.param])


def test_config_is_normalised(moe_dir) -> None:
    arch, path = moe_dir
    cfg = read_hf_config(path)
    moe = cfg.moe
    assert moe is not None and moe.num_experts == 8
    assert moe.dense_layers == (() if arch == "MixtralForCausalLM" else (0,))
    if arch == "MixtralForCausalLM":
        assert (moe.scoring, moe.top_k, moe.norm_topk_prob) == ("softmax", 2, True)
        assert moe.expert_intermediate_size == 32 and moe.shared_expert_intermediate_size == 0
        assert cfg.rotary_dim is None and not cfg.qk_norm and cfg.sliding_window is None
    elif arch == "Glm4MoeForCausalLM":
        assert (moe.scoring, moe.num_groups, moe.topk_groups, moe.top_k) == (
            "grouped_sigmoid", 4, 2, 3)  # fmt: skip
        assert moe.routed_scaling_factor == 2.5 and moe.shared_expert_intermediate_size == 32
        assert cfg.rotary_dim == cfg.head_dim // 2 and cfg.attention_bias and not cfg.qk_norm
    else:
        assert (moe.scoring, moe.top_k, moe.norm_topk_prob) == ("softmax", 2, True)
        assert cfg.rotary_dim is None and cfg.qk_norm
    assert json.loads((path / "config.json").read_text())["architectures"] == [arch]


# One short of whole 16-token pages, so every request needs a new page as it decodes.
PROMPTS = [list(range(5, 36)), list(range(300, 347)), [7] * 15, list(range(1000, 1063))]
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def _greedy(llm: LLM) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.fixture(scope="module")
def baseline(moe_dir) -> list[list[int]]:
    _, path = moe_dir
    llm = LLM(model=str(path), device="cpu", max_total_tokens=4096)
    out = _greedy(llm)
    assert_engine_clean(llm.engine)
    return out


def test_greedy_matches_transformers(moe_dir, baseline) -> None:
    _, path = moe_dir
    assert baseline[0] == hf_greedy(path, PROMPTS[0], GREEDY.max_tokens)
    assert baseline[3] == hf_greedy(path, PROMPTS[3], GREEDY.max_tokens)


@pytest.mark.parametrize(
    "settings",
    [
        {"chunked_prefill_size": 16, "max_num_batched_tokens": 40},
        # known-token admission, so a small pool preempts
        {"max_total_tokens": 96, "page_size": 16, "schedule_conservativeness": 0},
    ],
    ids=["chunked", "preemption"],
)
def test_engine_settings_keep_greedy_tokens(moe_dir, baseline, settings) -> None:
    _, path = moe_dir
    llm = LLM(model=str(path), device="cpu", **{"max_total_tokens": 4096, **settings})
    assert _greedy(llm) == baseline
    if settings.get("max_total_tokens") == 96:
        assert llm.engine.scheduler.counters.preemptions > 0
    again = llm.generate([PROMPTS[3]], GREEDY)[0]  # a prefix hit
    assert again.cached_tokens > 0 and again.token_ids == baseline[3]
    assert_engine_clean(llm.engine)


def _naive_moe(x, w13, w2, weights, ids) -> torch.Tensor:  # noqa: ANN001
    out = torch.zeros(x.shape[0], w2.shape[1])
    inter = w2.shape[2]
    for t in range(x.shape[0]):
        for w, e in zip(weights[t].tolist(), ids[t].tolist()):
            gu = w13[e] @ x[t]
            out[t] += w * (w2[e] @ (torch.nn.functional.silu(gu[:inter]) * gu[inter:]))
    return out


@pytest.mark.parametrize("load", ["uniform", "one_expert", "two_of_eight"])
def test_fused_moe_reference_under_uneven_loads(load: str) -> None:
    gen = torch.Generator().manual_seed(0)
    tokens, experts, hidden, inter, k = 37, 8, 24, 16, 2
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.2
    w2 = torch.randn(experts, hidden, inter, generator=gen) * 0.2
    ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)])
    if load == "one_expert":
        ids[:, 0], ids[:, 1] = 3, 5  # every token to expert 3 first; 6 experts get nothing
    elif load == "two_of_eight":
        ids = ids % 2
        ids[:, 1] = 1 - ids[:, 0]
    weights = torch.rand(tokens, k, generator=gen)
    expected = _naive_moe(x, w13, w2, weights, ids)
    got = fused_moe_reference(x, w13, w2, weights, ids.to(torch.int32))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("tokens", "block_m"), [(1, 16), (5, 4), (64, 16), (300, 64)])
def test_sorted_slots_cover_each_slot_once_in_its_experts_blocks(tokens: int, block_m: int) -> None:
    experts, k = 8, 2
    gen = torch.Generator().manual_seed(tokens)
    ids = torch.randint(0, experts, (tokens, k), generator=gen)
    ids[: tokens // 2] = 6  # an overloaded expert, and likely some empty ones
    s = sort_slots_by_expert(ids, experts, block_m)
    slots = s.slots.tolist()
    real = [v for v in slots if v < tokens * k]
    assert sorted(real) == list(range(tokens * k))
    flat = ids.flatten().tolist()
    for block, expert in enumerate(s.block_expert.tolist()):
        block_slots = [v for v in slots[block * block_m : (block + 1) * block_m] if v < len(flat)]
        if expert < 0:
            assert not block_slots
        else:
            assert all(flat[v] == expert for v in block_slots)


def test_bad_moe_config_is_refused() -> None:
    with pytest.raises(Exception, match="experts per token"):
        MoEConfig(num_experts=4, top_k=5, expert_intermediate_size=8)
    with pytest.raises(Exception, match="groups"):
        MoEConfig(num_experts=6, top_k=2, expert_intermediate_size=8, num_groups=4)
