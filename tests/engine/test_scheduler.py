from __future__ import annotations

from sched_helpers import (
    PAGE,
    make_request,
    make_scheduler,
    run_one_after_the_other,
    run_step,
    run_to_completion,
)

from kvserve.engine.core.request import FinishReason, RequestStatus


def test_prefill_then_one_token_per_decode_step() -> None:
    sched, kv = make_scheduler(32)
    req = make_request("a", list(range(1, 11)), max_tokens=3)
    sched.add(req)
    plan = run_step(sched, kv)
    assert [(c.start, c.num_new_tokens, c.sample) for c in plan.chunks] == [(0, 10, True)]
    plan = run_step(sched, kv)
    assert [(c.start, c.num_new_tokens) for c in plan.chunks] == [(10, 1)]
    run_to_completion(sched, kv)
    assert req.output_token_ids == [9, 9, 9]
    assert req.finish_reason is FinishReason.LENGTH
    assert kv.usage == 0


def test_chunked_prefill_shares_steps_with_decodes() -> None:
    sched, kv = make_scheduler(64, chunked_prefill_size=8, max_num_batched_tokens=10)
    short = make_request("short", [1, 2, 3], max_tokens=8)
    sched.add(short)
    run_step(sched, kv)  # short is now decoding
    long = make_request("long", list(range(100, 130)), max_tokens=2)
    sched.add(long)
    plan = run_step(sched, kv)
    sizes = {c.request.request_id: (c.num_new_tokens, c.sample) for c in plan.chunks}
    assert sizes == {"short": (1, True), "long": (8, False)}
    assert plan.num_batched_tokens <= 10
    while long.num_computed_tokens < 30:
        plan = run_step(sched, kv)
        assert sum(c.num_new_tokens for c in plan.chunks) <= 10
    assert long.num_output_tokens == 1  # sampled exactly when its prompt was complete
    run_to_completion(sched, kv)
    assert kv.usage == 0


def test_max_running_requests_and_fcfs() -> None:
    sched, kv = make_scheduler(64, max_running_requests=2)
    reqs = [make_request(str(i), [i + 1] * 5, max_tokens=2) for i in range(4)]
    for r in reqs:
        sched.add(r)
    plan = run_step(sched, kv)
    assert [c.request.request_id for c in plan.chunks] == ["0", "1"]
    run_to_completion(sched, kv)
    assert all(r.status is RequestStatus.FINISHED for r in reqs)


def test_preempts_newest_and_recomputes_it() -> None:
    # 6 pages of 4 tokens: two requests of 8 prompt tokens growing to 16 cannot both fit.
    # Admission on known tokens alone lets both in.
    sched, kv = make_scheduler(6, prefix_cache=False, schedule_conservativeness=0)
    old = make_request("old", list(range(1, 9)), max_tokens=8)
    new = make_request("new", list(range(20, 28)), max_tokens=8)
    sched.add(old)
    sched.add(new)
    preempted = []
    while sched.has_unfinished():
        plan = run_step(sched, kv)
        preempted += [r.request_id for r in plan.preempted]
    assert preempted and set(preempted) == {"new"}
    assert old.output_token_ids == [9] * 8 and new.output_token_ids == [9] * 8
    assert new.num_preemptions >= 1 and kv.usage == 0


def test_a_prompt_that_cannot_finish_beside_running_prefills_waits() -> None:
    # 10 pages of 4 tokens, chunks of 4: two 24-token prompts (6 pages each) cannot both be
    # resident. The second starts once the first is done, so no prompt is computed twice.
    sched, kv = make_scheduler(10, prefix_cache=False, chunked_prefill_size=4,
                               max_num_batched_tokens=8)  # fmt: skip
    first = make_request("first", list(range(1, 25)), max_tokens=2)
    second = make_request("second", list(range(30, 54)), max_tokens=2)
    assert run_one_after_the_other(sched, kv, first, second) == 48
    assert first.output_token_ids == second.output_token_ids == [9, 9]


def test_prefix_hit_counts_whole_shared_pages() -> None:
    sched, kv = make_scheduler(64)
    system = list(range(1, 14))  # 13 tokens: 3 full pages of 4
    first = make_request("first", system + [50, 51], max_tokens=1)
    sched.add(first)
    run_to_completion(sched, kv)
    second = make_request("second", system + [60, 61, 62], max_tokens=1)
    sched.add(second)
    plan = run_step(sched, kv)
    assert second.num_cached_tokens == 3 * PAGE
    assert plan.chunks[0].start == 12 and plan.chunks[0].num_new_tokens == 4
    assert sched.counters.prefix_cache_hits == 12
    assert sched.counters.prefix_cache_queries == 15 + 16


def test_fully_cached_prompt_still_computes_its_last_token() -> None:
    sched, kv = make_scheduler(64)
    prompt = list(range(1, 9))  # exactly two pages
    for rid in ("a", "b"):
        sched.add(make_request(rid, prompt, max_tokens=1))
        run_to_completion(sched, kv)
    assert sched.counters.prefix_cache_hits == 4  # page 2 holds the last token: recomputed


def test_shared_prefix_in_flight_waits_one_step_then_hits() -> None:
    sched, kv = make_scheduler(64)
    prompt = list(range(1, 18))
    a, b = make_request("a", prompt, max_tokens=2), make_request("b", prompt, max_tokens=2)
    sched.add(a)
    sched.add(b)
    plan = run_step(sched, kv)
    assert [c.request.request_id for c in plan.chunks] == ["a"]
    run_step(sched, kv)
    assert b.num_cached_tokens == 16


def test_abort_frees_everything() -> None:
    sched, kv = make_scheduler(16, prefix_cache=False)
    running, waiting = make_request("r", [1] * 10), make_request("w", [2] * 10)
    sched.add(running)
    run_step(sched, kv)
    sched.add(waiting)
    sched.abort(running)
    sched.abort(waiting)
    assert running.finish_reason is FinishReason.ABORT
    assert not sched.has_unfinished()
    kv.check_integrity([])
    assert kv.num_free_pages == 16


def test_eviction_under_pressure_keeps_serving() -> None:
    sched, kv = make_scheduler(8)
    for i in range(10):
        sched.add(make_request(str(i), [i + 1] * 12, max_tokens=4))
        run_to_completion(sched, kv)
    assert kv.num_available_pages == 8


def test_eos_and_stop_token_ids_finish_with_stop() -> None:
    sched, kv = make_scheduler(16)
    eos = make_request("eos", [1, 2, 3])
    sched.add(eos)
    plan = sched.schedule()
    sched.update(plan, {"eos": 0})
    assert eos.finish_reason is FinishReason.STOP and eos.stop_reason is None
    stop = make_request("stop", [1, 2, 3], stop_token_ids=[9])
    sched.add(stop)
    run_to_completion(sched, kv)
    assert stop.finish_reason is FinishReason.STOP and stop.stop_reason == 9
    ignore = make_request("ignore", [1, 2, 3], max_tokens=3, ignore_eos=True)
    sched.add(ignore)
    for _ in range(3):
        plan = sched.schedule()
        sched.update(plan, {"ignore": 0})
    assert ignore.finish_reason is FinishReason.LENGTH and ignore.output_token_ids == [0, 0, 0]


def test_plans_the_next_step_while_one_is_in_flight() -> None:
    sched, kv = make_scheduler(32)
    req = make_request("a", list(range(1, 11)), max_tokens=3)
    sched.add(req)
    first = sched.schedule()  # prefill; samples output 0
    second = sched.schedule()  # decodes output 0 before it is known on the host
    assert [(c.start, c.num_new_tokens, c.sample) for c in second.chunks] == [(10, 1, True)]
    assert req.num_pending == 2 and req.num_computed_tokens == 11
    sched.update(first, {"a": 5})
    third = sched.schedule()
    assert [(c.start, c.num_new_tokens) for c in third.chunks] == [(11, 1)]
    sched.update(second, {"a": 6})
    assert sched.schedule().is_empty  # its pending token is its last: nothing to compute
    sched.update(third, {"a": 7})
    assert req.output_token_ids == [5, 6, 7] and req.finish_reason is FinishReason.LENGTH
    assert req.num_pending == 0 and kv.usage == 0
    kv.check_integrity(sched.live_block_tables())


def test_token_sampled_after_a_stop_in_flight_is_dropped() -> None:
    sched, kv = make_scheduler(32)
    req = make_request("a", list(range(1, 11)), max_tokens=8)
    sched.add(req)
    first, second = sched.schedule(), sched.schedule()
    sched.update(first, {"a": 0})  # EOS
    assert req.finish_reason is FinishReason.STOP and kv.usage == 0
    assert sched.update(second, {"a": 9}) == []
    assert req.output_token_ids == [0]
    kv.check_integrity(sched.live_block_tables())


def _token_for(req_id: str, index: int) -> int:
    return 1 + (sum(map(ord, req_id)) * 31 + index * 7) % 50  # never the EOS id 0


def _run(sched, kv, overlap: bool) -> None:  # noqa: ANN001 - scheduler helpers' types
    """The engine's loop without a model: with overlap, each plan is made before the previous
    step's tokens are handed back."""
    in_flight = None
    while sched.has_unfinished() or in_flight is not None:
        plan = sched.schedule()
        if not overlap:
            sched.update(plan, _sampled(plan))
            continue
        if in_flight is not None:
            sched.update(in_flight, _sampled(in_flight))
            kv.check_integrity(sched.live_block_tables())
        in_flight = None if plan.is_empty else plan


def _sampled(plan) -> dict[str, int]:  # noqa: ANN001
    return {
        c.request.request_id: _token_for(c.request.request_id, c.request.num_output_tokens)
        for c in plan.chunks
        if c.sample
    }


def test_overlap_gives_the_same_tokens_under_preemption() -> None:
    outputs = {}
    for overlap in (False, True):
        sched, kv = make_scheduler(7, schedule_conservativeness=0)
        reqs = [make_request(str(i), list(range(10 * i + 1, 10 * i + 9)), 9) for i in range(3)]
        for r in reqs:
            sched.add(r)
        _run(sched, kv, overlap)
        assert sched.counters.preemptions > 0
        assert kv.usage == 0
        outputs[overlap] = [r.output_token_ids for r in reqs]
    assert outputs[True] == outputs[False]
    assert all(len(o) == 9 for o in outputs[True])


def test_long_context_chunks_shrink_while_others_decode() -> None:
    """chunk_attention_budget: beside a decoding request, a chunk ending at context c takes at
    most budget / c tokens (never under 256); with nothing decoding or waiting, full chunks."""
    cfg = {"chunked_prefill_size": 1024, "max_num_batched_tokens": 4096}
    sched, kv = make_scheduler(2048, chunk_attention_budget=1024 * 2048, **cfg)
    long = make_request("long", list(range(1, 6001)), max_tokens=2)
    sched.add(long)
    sizes = [run_step(sched, kv).chunks[0].num_new_tokens for _ in range(3)]
    assert sizes == [1024, 1024, 1024]  # alone: no cap
    short = make_request("short", [1, 2, 3], max_tokens=50)
    sched.add(short)
    run_step(sched, kv)  # short prefills beside the long prompt
    plan = run_step(sched, kv)
    chunks = {c.request.request_id: c for c in plan.chunks}
    assert chunks["short"].num_new_tokens == 1
    start = chunks["long"].start  # 4096 + the chunk before
    assert chunks["long"].num_new_tokens == max(256, 1024 * 2048 // (start + 1024))
    assert chunks["long"].num_new_tokens < 1024


def test_prefill_takes_whole_chunks_alone_and_short_ones_beside_others() -> None:
    """chunked_prefill_size bounds a chunk when no other request decodes or waits;
    prefill_chunk_while_decoding while one does, which leaves the step's budget room to admit
    a new request; the chunks grow back once the others are gone."""
    cfg = {"chunked_prefill_size": 1024, "prefill_chunk_while_decoding": 256,
           "max_num_batched_tokens": 1024}  # fmt: skip
    sched, kv = make_scheduler(2048, **cfg)
    long = make_request("long", list(range(1, 8001)), max_tokens=2)
    sched.add(long)
    assert run_step(sched, kv).chunks[0].num_new_tokens == 1024  # alone: the whole chunk
    short = make_request("short", [1, 2, 3], max_tokens=3)
    sched.add(short)
    plan = run_step(sched, kv)  # short waits: long takes 256 and short is admitted beside it
    assert {c.request.request_id: c.num_new_tokens for c in plan.chunks} == {
        "long": 256, "short": 3}  # fmt: skip
    while short.status is not RequestStatus.FINISHED:
        plan = run_step(sched, kv)
        chunks = {c.request.request_id: c.num_new_tokens for c in plan.chunks}
        assert chunks == {"short": 1, "long": 256}  # short decodes
    assert run_step(sched, kv).chunks[0].num_new_tokens == 1024  # short is gone


def test_chunk_attention_budget_is_off_by_default() -> None:
    sched, kv = make_scheduler(2048, chunked_prefill_size=1024)
    short = make_request("short", [1, 2, 3], max_tokens=50)
    sched.add(short)
    run_step(sched, kv)
    sched.add(make_request("long", list(range(1, 6001)), max_tokens=2))
    for _ in range(4):
        plan = run_step(sched, kv)
        assert max(c.num_new_tokens for c in plan.chunks) == 1024
