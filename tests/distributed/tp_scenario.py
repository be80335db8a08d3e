"""One scripted workload run on an engine at any --tp, and the comparison of two runs.

The workload covers the scheduler's paths: a prefix-sharing second wave (prefix-cache hits),
prompts longer than the chunk size (chunked prefill) and a KV pool too small for the batch
(preemption). Greedy, with the top-2 logprobs kept to tell near-ties from real differences."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvserve.engine.config_builder import build_engine_config
from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.engine.engine_core import EngineCore

NEAR_TIE = 0.05  # top-2 logprob margin under which a different greedy pick is tolerated
SETTINGS = {
    "device": "cpu",
    "dtype": "float32",
    "page_size": 16,
    "max_total_tokens": 128,  # 8 pages: the second wave cannot all fit, so some are preempted
    "chunked_prefill_size": 16,
    "max_running_requests": 4,
    "schedule_conservativeness": 0,  # admission on known tokens alone, so the wave preempts
}
PREFIX = [(7 * i + 3) % 997 + 20 for i in range(40)]


@dataclass
class Run:
    tokens: dict[str, list[int]] = field(default_factory=dict)
    margins: dict[str, list[float]] = field(default_factory=dict)
    preemptions: int = 0
    prefix_hits: int = 0


def _drain(core: EngineCore, run: Run) -> None:
    while core.has_unfinished():
        for out in core.step():
            run.tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            for lp in out.new_logprobs or []:
                top = [v for _, v in lp.top] + [float("-inf")] * 2
                run.margins.setdefault(out.request_id, []).append(top[0] - top[1])


def run_workload(model: str, tp: int, max_tokens: int = 10, **settings: object) -> Run:
    config = build_engine_config(model, tp=tp, **{**SETTINGS, **settings})
    core = EngineCore(config)
    run = Run()
    try:
        params = SamplingParams(temperature=0, max_tokens=max_tokens, logprobs=2)
        core.add_request("first", PREFIX + [101, 102], params)
        _drain(core, run)
        for i in range(4):  # shares the first's 40-token prefix: its full pages are cached
            core.add_request(f"wave{i}", PREFIX + [200 + i] * (i + 1), params)
        _drain(core, run)
        stats = core.stats()
        run.preemptions, run.prefix_hits = stats.num_preemptions, stats.prefix_cache_hits
        core.check_integrity()
    finally:
        core.close()
    return run


def compare(reference: Run, candidate: Run) -> tuple[int, list[str]]:
    """(near-ties, real differences): per request, tokens must match up to the first pick
    where the reference's top-2 margin is under NEAR_TIE; the rest is not compared."""
    ties, diffs = 0, []
    for rid, ref in reference.tokens.items():
        got = candidate.tokens.get(rid, [])
        for i, (a, b) in enumerate(zip(ref, got)):
            if a != b:
                if reference.margins[rid][i] < NEAR_TIE:
                    ties += 1
                else:
                    diffs.append(f"{rid}[{i}]: {a} vs {b}")
                break
        else:
            if len(ref) != len(got):
                diffs.append(f"{rid}: {len(ref)} vs {len(got)} tokens")
    return ties, diffs
