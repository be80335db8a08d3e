"""Building blocks for scheduler tests that need no model: requests from token lists and a
loop that plays the runner's part with fixed sampled tokens."""

from __future__ import annotations

from kvserve.config import SchedulerConfig
from kvserve.engine.core.kv_cache_manager import KVCacheManager
from kvserve.engine.core.request import Request
from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.engine.core.scheduler import Scheduler
from kvserve.engine.core.scheduler_output import SchedulerOutput

PAGE = 4


def make_scheduler(
    num_pages: int, prefix_cache: bool = True, **sched: float
) -> tuple[Scheduler, KVCacheManager]:
    kv = KVCacheManager(num_pages, PAGE, prefix_cache)
    return Scheduler(SchedulerConfig(**sched), kv), kv


def make_request(rid: str, prompt: list[int], max_tokens: int = 4, **params: object) -> Request:
    return Request(
        request_id=rid,
        prompt_token_ids=prompt,
        params=SamplingParams(max_tokens=max_tokens, **params),
        seed=0,
        arrival_time=0.0,
        max_tokens=max_tokens,
        eos_token_ids=(0,),
    )


def run_step(sched: Scheduler, kv: KVCacheManager, token: int = 9) -> SchedulerOutput:
    plan = sched.schedule()
    sched.update(plan, {c.request.request_id: token for c in plan.chunks if c.sample})
    kv.check_integrity(sched.live_block_tables())
    return plan


def run_to_completion(sched: Scheduler, kv: KVCacheManager, max_steps: int = 1000) -> int:
    steps = 0
    while sched.has_unfinished():
        run_step(sched, kv)
        steps += 1
        assert steps < max_steps, "scheduler made no progress"
    return steps


def run_one_after_the_other(
    sched: Scheduler, kv: KVCacheManager, first: Request, second: Request
) -> int:
    """Adds both and runs them to the end, checking that ``second`` starts only once ``first``
    is done and that nothing is preempted; returns the prompt rows computed."""
    sched.add(first)
    sched.add(second)
    prompt_rows = 0
    while sched.has_unfinished():
        plan = run_step(sched, kv)
        prompt_rows += sum(c.num_new_tokens for c in plan.chunks if c.num_new_tokens > 1)
        assert not plan.preempted
        if second.num_computed_tokens:
            assert first.is_finished
    assert sched.counters.preemptions == 0
    return prompt_rows
