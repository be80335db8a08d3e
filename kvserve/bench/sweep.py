"""`kvserve bench sweep`: hold each concurrency level for a duration, find the knee.

Knee (WORKLOADS.md): the first step where doubling concurrency adds less than ``threshold`` of
throughput while P99 TTFT grows. Steps that are not doublings are normalised to a doubling:
gain per doubling = (thr_i / thr_{i-1}) ** (1 / log2(c_i / c_{i-1})) - 1. The recommendation is
the step before the knee (the last step when there is no knee).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from kvserve.bench import outputs, plots, report_html
from kvserve.bench.client import Target
from kvserve.bench.profiles import Unit
from kvserve.bench.runner import LoadConfig, run
from kvserve.bench.tokens import Tokenizer

SWEEP_KEYS = (
    "concurrency",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "p99_ttft_ms",
    "median_ttft_ms",
    "p99_tpot_ms",
    "failed",
    "cache_hit_rate",
)


def find_knee(levels: list[dict], threshold: float = 0.1) -> int | None:
    """Index of the knee step in ``levels`` (sorted by concurrency), or None."""
    for i in range(1, len(levels)):
        prev, cur = levels[i - 1], levels[i]
        if prev["output_throughput"] <= 0:
            continue
        doublings = math.log2(cur["concurrency"] / prev["concurrency"])
        ratio = max(cur["output_throughput"], 1e-12) / prev["output_throughput"]
        gain = ratio ** (1 / doublings) - 1
        if gain < threshold and cur["p99_ttft_ms"] > prev["p99_ttft_ms"]:
            return i
    return None


def summarize(levels: list[dict], threshold: float) -> dict:
    knee = find_knee(levels, threshold)
    best = levels[-1] if knee is None else levels[max(knee - 1, 0)]
    return {
        "levels": levels,
        "knee_threshold": threshold,
        "knee_concurrency": None if knee is None else levels[knee]["concurrency"],
        "recommended_concurrency": best["concurrency"],
    }


def render(summary: dict) -> str:
    head = f"{'conc':>6} {'req/s':>9} {'out tok/s':>10} {'P99 TTFT ms':>12} {'failed':>7}"
    rows = [" Concurrency Sweep ".center(50, "="), head]
    for lv in summary["levels"]:
        mark = "  <- knee" if lv["concurrency"] == summary["knee_concurrency"] else ""
        rows.append(f"{lv['concurrency']:>6} {lv['request_throughput']:>9.2f} "
                    f"{lv['output_throughput']:>10.1f} {lv['p99_ttft_ms']:>12.1f} "
                    f"{lv['failed']:>7}{mark}")  # fmt: skip
    knee = summary["knee_concurrency"]
    rows.append(f"Knee: {knee if knee is not None else 'none found'} "
                f"(threshold {summary['knee_threshold']:.0%} per doubling)")  # fmt: skip
    rows.append(f"Recommended concurrency: {summary['recommended_concurrency']}")
    return "\n".join(rows + ["=" * 50])


def write_sweep(out: Path, summary: dict, meta: dict) -> str:
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps({**summary, "meta": meta}, indent=2))
    png = plots.sweep_curves(summary["levels"], summary["knee_concurrency"], out / "sweep.png")
    block = render(summary)
    table = report_html.table(summary["levels"])
    (out / "report.html").write_text(
        report_html.render("kvserve bench sweep", block, [png], {"Levels": table})
    )
    return block


def run_sweep(
    make_units: Callable[[], Iterator[Unit]], target: Target, tok: Tokenizer, load: LoadConfig,
    concurrencies: list[int], meta: dict, out: Path, threshold: float = 0.1,
) -> str:  # fmt: skip
    """Each level on a fresh copy of the seeded workload; every level's run is kept under out/."""
    levels = []
    for conc in sorted(concurrencies):
        level_load = replace(load, max_concurrency=conc, num_requests=None)
        outcome = run(make_units(), target, tok, level_load, open_loop=False)
        level_meta = {**meta, "model": outcome.model, "max_concurrency": conc}
        outputs.write_run(out / f"c{conc}", outcome.records, level_meta, outcome.server)
        result = outputs.result_dict(outcome.records, level_meta, outcome.server)
        levels.append({k: result.get(k, conc) for k in SWEEP_KEYS} | {"concurrency": conc})
    return write_sweep(out, summarize(levels, threshold), meta)
