"""Generated pages are cached too: the next turn of a chat, which resends the history with the
model's answer, hits the cache beyond the first turn's prompt."""

from __future__ import annotations

from engine_checks import assert_engine_clean

from kvserve import LLM, SamplingParams


def test_second_turn_hits_the_cached_answer(bundled_llm: LLM) -> None:
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    history = [{"role": "user", "content": "Tell me a short story about a lighthouse."}]
    first = bundled_llm.chat(history, params)[0]
    history += [
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "Now give it a title."},
    ]
    second = bundled_llm.chat(history, SamplingParams(temperature=0, max_tokens=4))[0]
    # Tokens the second prompt shares with what the engine computed in turn one.
    computed = first.prompt_token_ids + first.token_ids
    shared = 0
    for a, b in zip(second.prompt_token_ids, computed):
        if a != b:
            break
        shared += 1
    page = bundled_llm.config.cache.page_size
    assert shared > first.prompt_tokens + page  # the answer itself is part of the shared prefix
    assert second.cached_tokens == min(shared, len(computed) - 1) // page * page
    assert_engine_clean(bundled_llm.engine)
