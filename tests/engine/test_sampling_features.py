"""Sampling features on the bundled model: seeds, stop strings, n > 1, logprobs, penalties."""

from __future__ import annotations

import math

import pytest
import torch
from engine_checks import assert_engine_clean

from kvserve import LLM, SamplingParams

PROMPT = "The three most important inventions in history are"


@pytest.fixture(params=["sync", "overlap"])
def llm(request: pytest.FixtureRequest, bundled_llm: LLM, bundled_llm_overlap: LLM) -> LLM:
    """Every feature, with each step waited for and with one step kept in flight."""
    return bundled_llm if request.param == "sync" else bundled_llm_overlap


def test_seeded_sampling_is_independent_of_batch_mates(llm: LLM) -> None:
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=16)
    alone = llm.generate(PROMPT, seeded)[0].token_ids
    others = [f"Story number {i}: once upon a time" for i in range(5)]
    crowd = llm.generate(
        [*others[:2], PROMPT, *others[2:]],
        [SamplingParams(temperature=0.8, max_tokens=12)] * 2
        + [seeded]
        + [SamplingParams(temperature=0.8, max_tokens=12)] * 3,
    )
    assert crowd[2].token_ids == alone
    other_seed = SamplingParams(temperature=1.0, top_p=0.9, seed=99, max_tokens=16)
    assert llm.generate(PROMPT, other_seed)[0].token_ids != alone
    assert_engine_clean(llm.engine)


def test_top_k_one_and_tiny_top_p_are_greedy(llm: LLM) -> None:
    greedy = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=10))[0]
    top_k = llm.generate(PROMPT, SamplingParams(top_k=1, max_tokens=10, seed=5))[0]
    top_p = llm.generate(PROMPT, SamplingParams(top_p=1e-6, max_tokens=10, seed=5))[0]
    min_p = llm.generate(PROMPT, SamplingParams(min_p=1.0, max_tokens=10, seed=5))[0]
    assert greedy.token_ids == top_k.token_ids == top_p.token_ids == min_p.token_ids


def test_stop_string_across_tokens_is_cut(llm: LLM) -> None:
    full = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=30))[0].text
    # A stop string that starts mid-word and spans several tokens.
    cut_at = len(full) // 2
    stop = full[cut_at : cut_at + 7]
    assert stop.strip() and len(stop) == 7
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=30, stop=[stop]))
    result = out[0].outputs[0]
    assert result.text == full[: full.index(stop)]
    assert result.finish_reason == "stop" and result.stop_reason == stop
    kept = SamplingParams(
        temperature=0, max_tokens=30, stop=[stop], include_stop_str_in_output=True
    )
    assert llm.generate(PROMPT, kept)[0].text == full[: full.index(stop) + len(stop)]
    assert_engine_clean(llm.engine)


def test_n_samples_share_the_prompt_cache(llm: LLM) -> None:
    prompt = "A long shared context about the history of the printing press. " * 6
    out = llm.generate(prompt, SamplingParams(n=4, temperature=1.0, max_tokens=8, seed=7))
    assert len(out) == 1 and len(out[0].outputs) == 4
    texts = {o.text for o in out[0].outputs}
    assert len(texts) > 1  # different seeds per sample
    hits_before = llm.engine.scheduler.counters.prefix_cache_hits
    again = llm.generate(prompt, SamplingParams(n=4, temperature=1.0, max_tokens=8, seed=7))
    assert [o.token_ids for o in again[0].outputs] == [o.token_ids for o in out[0].outputs]
    assert llm.engine.scheduler.counters.prefix_cache_hits > hits_before
    assert out[0].completion_tokens == sum(len(o.token_ids) for o in out[0].outputs)


def test_logprobs_match_reference_log_softmax(llm: LLM, bundled_reference) -> None:
    params = SamplingParams(temperature=0, max_tokens=5, logprobs=3)
    out = llm.generate(PROMPT, params)[0]
    ids = out.prompt_token_ids + out.token_ids
    with torch.no_grad():
        logits = bundled_reference(torch.tensor([ids])).logits[0].float()
    ref = logits.log_softmax(-1)
    n = len(out.prompt_token_ids)
    assert out.outputs[0].logprobs is not None
    for i, entry in enumerate(out.outputs[0].logprobs):
        row = ref[n - 1 + i]
        assert entry.token_id == out.token_ids[i]
        assert math.isclose(entry.logprob, row[entry.token_id].item(), abs_tol=1e-3)
        top_values, top_ids = row.topk(3)
        assert [t for t, _ in entry.top] == top_ids.tolist()
        for (_, lp), expected in zip(entry.top, top_values.tolist()):
            assert math.isclose(lp, expected, abs_tol=1e-3)


def test_penalties_discourage_repeats(llm: LLM) -> None:
    prompt = "Repeat after me: apple apple apple apple apple apple"
    plain = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=20))[0]
    penalised = llm.generate(
        prompt,
        SamplingParams(temperature=0, max_tokens=20, repetition_penalty=1.5, frequency_penalty=1.0),
    )[0]

    def repeats(ids: list[int]) -> int:
        return len(ids) - len(set(ids))

    assert repeats(penalised.token_ids) < repeats(plain.token_ids)


def test_max_tokens_and_ignore_eos(llm: LLM) -> None:
    out = llm.generate("Hi", SamplingParams(temperature=0, max_tokens=7, ignore_eos=True))
    assert len(out[0].token_ids) == 7 and out[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -1}, "temperature must be >= 0"),
        ({"top_p": 0}, "top_p must be in"),
        ({"top_p": 1.5}, "top_p must be in"),
        ({"top_k": -3}, "top_k must be"),
        ({"max_tokens": 0}, "max_tokens must be at least 1"),
        ({"n": 0}, "n must be at least 1"),
        ({"presence_penalty": 3}, "presence_penalty must be in"),
        ({"logprobs": 50}, "logprobs must be in"),
    ],
)
def test_invalid_sampling_values(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_bad_prompts_are_refused_before_queueing(llm: LLM) -> None:
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.generate("")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[1, 2, 10**6]])
    ctx = llm.engine.context_length
    with pytest.raises(ValueError, match=rf"exceeds the context length of {ctx}"):
        llm.generate([[5] * 100], SamplingParams(max_tokens=ctx))
    with pytest.raises(ValueError, match="leaves no room"):
        llm.generate([[5] * ctx])
    assert not llm.engine.has_unfinished()
    assert_engine_clean(llm.engine)
