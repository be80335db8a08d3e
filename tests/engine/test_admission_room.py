"""Admission keeps room for the running requests' expected output (SGLang's new_token_ratio
rule), and the running cap follows the KV pool when none is given."""

from __future__ import annotations

import argparse
import math

import pytest
from sched_helpers import make_request, make_scheduler, run_one_after_the_other, run_step

from kvserve import LLM
from kvserve.config import AUTO_MAX_RUNNING, AUTO_MIN_RUNNING, SchedulerConfig
from kvserve.engine.config_builder import build_engine_config
from kvserve.engine.core.future_tokens import DECAY_STEPS, FUTURE_CLIP, FutureTokens
from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.errors import ConfigError
from kvserve.flags import add_flags, engine_settings
from kvserve.layers.attention.cudnn_prefill import GraphDims


def test_a_request_waits_for_room_for_the_running_ones_output() -> None:
    # 6 pages of 4 tokens; each request has 8 prompt tokens and may add 8. Known tokens alone
    # would let both in and preempt one (test_scheduler); with room kept for the first's
    # expected 6 outputs (8 x 0.7) the second waits, and nothing is computed twice.
    sched, kv = make_scheduler(6, prefix_cache=False)
    first = make_request("first", list(range(1, 9)), max_tokens=8)
    second = make_request("second", list(range(20, 28)), max_tokens=8)
    assert run_one_after_the_other(sched, kv, first, second) == 16
    assert first.output_token_ids == second.output_token_ids == [9] * 8


def test_the_ratio_falls_while_decoding_and_returns_on_preemption() -> None:
    future = FutureTokens.for_conservativeness(1.0)
    assert future.ratio == pytest.approx(0.7)
    for _ in range(DECAY_STEPS // 2):
        future.after_decode_step()
    assert future.ratio == pytest.approx(0.7 - (0.7 - 0.098) / 2)
    for _ in range(DECAY_STEPS):
        future.after_decode_step()
    assert future.ratio == pytest.approx(0.098)
    future.after_preemption()
    assert future.ratio == pytest.approx(0.7)


def test_expected_output_is_clipped_and_counts_pending_tokens() -> None:
    future = FutureTokens.for_conservativeness(1.0)
    long = make_request("long", [1, 2, 3], max_tokens=100_000)
    assert future.expected(long) == math.ceil(FUTURE_CLIP * 0.7)
    short = make_request("short", [1, 2, 3], max_tokens=10)
    short.output_token_ids, short.num_pending = [5, 5, 5], 1
    assert future.expected(short) == math.ceil(6 * 0.7)
    assert FutureTokens.for_conservativeness(0).expected(long) == 0
    assert FutureTokens.for_conservativeness(3).ratio == 1.0  # never more than all of it


def test_the_scheduler_decays_its_ratio_and_resets_it_when_it_preempts() -> None:
    # Three requests of 8 prompt tokens and up to 9 outputs in 7 pages of 4: with a
    # conservativeness of 0.2 (ratio 0.14) they are all admitted and some are preempted.
    sched, kv = make_scheduler(7, schedule_conservativeness=0.2)
    for i in range(3):
        sched.add(make_request(str(i), list(range(10 * i + 1, 10 * i + 9)), max_tokens=9))
    ratios, preempted_at = [], []
    while sched.has_unfinished():
        plan = run_step(sched, kv)
        ratios.append(sched.future.ratio)
        if plan.preempted:
            preempted_at.append(len(ratios) - 1)
    assert preempted_at and sched.counters.preemptions > 0
    init = sched.future.init
    assert all(ratios[i] == init for i in preempted_at)
    assert min(ratios) < init  # decode steps without a preemption lowered it


def test_the_running_cap_follows_the_pool_when_unset() -> None:
    auto = SchedulerConfig()
    assert auto.max_running_requests is None and auto.running_ceiling == AUTO_MAX_RUNNING
    # An H200's FP8-weight pool (865,136 tokens of bf16 KV): 422 requests of 2,048 tokens,
    # down to a multiple of 16
    assert auto.for_pool(865_136).max_running_requests == 416
    assert auto.for_pool(865_136 - 12_000).max_running_requests == 416  # 12K tokens fewer
    assert auto.for_pool(32_768).max_running_requests == AUTO_MIN_RUNNING
    assert auto.for_pool(10**8).max_running_requests == AUTO_MAX_RUNNING
    assert SchedulerConfig(max_running_requests=100).for_pool(10**8).max_running_requests == 100
    # cuDNN prefill's batch buckets: up to the ceiling before the pool is sized, the cap after
    assert GraphDims.for_engine(auto, 512).max_batch == AUTO_MAX_RUNNING
    assert GraphDims.for_engine(auto.for_pool(865_136), 512).max_batch == 512  # 416 -> 512
    # a small step budget bounds the cap: every running request decodes in one step
    small = SchedulerConfig(max_num_batched_tokens=300, chunked_prefill_size=300)
    assert small.running_ceiling == 300 and small.for_pool(10**8).max_running_requests == 300


def test_bad_conservativeness_is_refused_and_the_flag_reaches_the_config() -> None:
    with pytest.raises(ConfigError, match="schedule_conservativeness must be >= 0"):
        SchedulerConfig(schedule_conservativeness=-1)
    parser = argparse.ArgumentParser()
    add_flags(parser)
    args = parser.parse_args(["--schedule-conservativeness", "0.5"])
    assert build_engine_config(**engine_settings(args)).scheduler.schedule_conservativeness == 0.5


def test_the_engine_runs_with_the_cap_it_derived(tiny_model_dir) -> None:
    llm = LLM(model=str(tiny_model_dir("LlamaForCausalLM")), device="cpu", max_total_tokens=256)
    engine = llm.engine
    assert engine.config.scheduler.max_running_requests == AUTO_MIN_RUNNING
    assert engine.scheduler.max_running == AUTO_MIN_RUNNING
    assert engine.stats().num_running == 0
    outs = llm.generate([[5, 6, 7], [8, 9], [10]], SamplingParams(max_tokens=3, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [3, 3, 3]


def test_a_prefilled_request_joins_only_with_room_for_the_running_ones_output() -> None:
    # The disaggregated decode side's check: 6 pages of 4 tokens, a running request of 8
    # prompt tokens expected to add 6 (8 x 0.7) holds or is owed 4 pages.
    sched, kv = make_scheduler(6, prefix_cache=False)
    running = make_request("running", list(range(1, 9)), max_tokens=8)
    arriving = make_request("arriving", list(range(20, 28)), max_tokens=8)
    assert sched.has_room_for(arriving)  # an empty engine takes any request that fits
    sched.add(running)
    run_step(sched, kv)
    assert not sched.has_room_for(arriving)
    assert sched.has_room_for(make_request("short", [30, 31, 32], max_tokens=1))
    full, _ = make_scheduler(64, max_running_requests=1)
    full.add(make_request("one", [1, 2], max_tokens=4))
    full.schedule()
    assert not full.has_room_for(make_request("two", [3, 4], max_tokens=1))
