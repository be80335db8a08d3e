"""The bundled SmolLM2 through the offline API against Hugging Face transformers (greedy),
and the engine features that must not change outputs: prefix cache, chunked prefill,
preemption."""

from __future__ import annotations

import pytest
import torch
from engine_checks import assert_engine_clean

from kvserve import LLM, SamplingParams

CHATS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "Write a haiku about the sea. Use vivid imagery, and mention the moon, the tide and a "
    "lonely lighthouse keeper who has watched the waves for forty years.",
    "hi",
    "Explain in two sentences why the sky is blue, as if to a child who has never seen a "
    "prism, and then give one everyday example of the same effect that they could observe "
    "at home, such as light through a glass of water or the colours in a soap bubble.",
]
GREEDY = SamplingParams(temperature=0, max_tokens=24)


def _reference_greedy(reference, prompt_ids: list[int], max_tokens: int) -> list[int]:
    with torch.no_grad():
        out = reference.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=2,
            pad_token_id=2,
        )
    ids = out[0, len(prompt_ids) :].tolist()
    return ids[: ids.index(2) + 1] if 2 in ids else ids


@pytest.fixture(scope="module")
def chat_results(bundled_llm: LLM):
    convs = [[{"role": "user", "content": c}] for c in CHATS]
    return bundled_llm.chat(convs, GREEDY)


def test_batched_chat_matches_transformers(bundled_llm, bundled_reference, chat_results) -> None:
    lengths = {r.prompt_tokens for r in chat_results}
    assert len(lengths) == len(CHATS)  # prompts of different lengths, run in one batch
    for result in chat_results:
        expected = _reference_greedy(bundled_reference, result.prompt_token_ids, 24)
        assert result.token_ids == expected
        assert result.text == bundled_llm.tokenizer.decode(expected)
    assert "Paris" in chat_results[0].text
    assert_engine_clean(bundled_llm.engine)


def _outputs(llm: LLM) -> list[list[int]]:
    convs = [[{"role": "user", "content": c}] for c in CHATS]
    return [r.token_ids for r in llm.chat(convs, GREEDY)]


@pytest.mark.parametrize(
    "settings",
    [
        # settings that touch different code paths share one engine (each costs a model load)
        {"disable_prefix_cache": True, "chunked_prefill_size": 16, "max_num_batched_tokens": 40},
        {"chunked_prefill_size": 7, "max_num_batched_tokens": 64, "overlap_schedule": True},
        # known-token admission, so a small pool preempts
        {"max_total_tokens": 192, "page_size": 16, "schedule_conservativeness": 0},
        {
            "overlap_schedule": True,
            "max_total_tokens": 160,
            "page_size": 16,
            "schedule_conservativeness": 0,
        },  # fmt: skip
    ],
    ids=["no-prefix-cache-chunk-16", "chunk-7-overlap", "preemption", "overlap-preemption"],
)
def test_engine_settings_do_not_change_outputs(settings, chat_results) -> None:
    llm = LLM(device="cpu", **settings)
    assert _outputs(llm) == [r.token_ids for r in chat_results]
    if "max_total_tokens" in settings:
        assert llm.engine.scheduler.counters.preemptions > 0
    assert_engine_clean(llm.engine)


def test_prefix_hit_reports_shared_whole_pages(bundled_llm: LLM) -> None:
    system = "You are a meticulous assistant. " * 12
    first = [{"role": "system", "content": system}, {"role": "user", "content": "One?"}]
    second = [{"role": "system", "content": system}, {"role": "user", "content": "Two, please?"}]
    params = SamplingParams(temperature=0, max_tokens=2)
    a = bundled_llm.chat(first, params)[0]
    b = bundled_llm.chat(second, params)[0]
    shared = 0
    for x, y in zip(a.prompt_token_ids, b.prompt_token_ids):
        if x != y:
            break
        shared += 1
    page = bundled_llm.config.cache.page_size
    assert b.cached_tokens == shared // page * page > 0
    assert_engine_clean(bundled_llm.engine)
