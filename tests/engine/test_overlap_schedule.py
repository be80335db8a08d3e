"""Overlap scheduling on the bundled model (forced on for CPU): the engine keeps one step in
flight, and requests that end, abort or use penalties while it runs are handled exactly."""

from __future__ import annotations

from engine_checks import assert_engine_clean

from kvserve import LLM, SamplingParams
from kvserve.engine.engine_core import EngineCore

PROMPT = [1, 504, 3458, 282, 4649, 314, 253, 1345, 28, 9175, 314, 6353, 30]


def _drain(core: EngineCore) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    while core.has_unfinished():
        for out in core.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


def test_step_returns_the_previous_steps_tokens(bundled_llm_overlap: LLM) -> None:
    core = bundled_llm_overlap.engine
    core.add_request("a", PROMPT, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert core.step() == []  # the prefill is launched; nothing has come back yet
    first = core.step()  # the decode of token 1 is launched, token 0 comes back
    assert [o.new_token_ids for o in first] == [[core.requests["a"].output_token_ids[0]]]
    assert core.requests["a"].num_pending == 1
    rest = _drain(core)
    assert len(rest["a"]) == 3
    assert_engine_clean(core)


def test_abort_while_its_step_is_in_flight(bundled_llm_overlap: LLM) -> None:
    core = bundled_llm_overlap.engine
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    core.add_request("keep", PROMPT, params)
    core.add_request("drop", PROMPT[::-1], params)
    early = core.step() + core.step()
    assert [o.request_id for o in early] == ["keep", "drop"]
    core.abort_request("drop")  # its next token is being sampled right now
    tokens = _drain(core)
    assert len(tokens["keep"]) == 11  # + the one in ``early``
    assert "drop" not in tokens
    assert_engine_clean(core)


def test_penalties_wait_for_the_tokens_they_count(
    bundled_llm: LLM, bundled_llm_overlap: LLM
) -> None:
    prompt = "Repeat after me: apple apple apple apple apple apple"
    penalised = SamplingParams(
        temperature=0, max_tokens=20, repetition_penalty=1.5, frequency_penalty=1.0
    )
    plain = SamplingParams(temperature=0, max_tokens=20)
    sync = bundled_llm.generate([prompt, prompt], [penalised, plain])
    overlap = bundled_llm_overlap.generate([prompt, prompt], [penalised, plain])
    assert [r.token_ids for r in overlap] == [r.token_ids for r in sync]
    assert overlap[0].token_ids != overlap[1].token_ids
    assert_engine_clean(bundled_llm_overlap.engine)
