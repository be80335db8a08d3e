"""Where a decode step's GPU time goes, kernel by kernel (torch profiler, CUPTI).

    python -m benchmarks.decode_profile --model benchmarks/configs/llama-3-8b --batches 1,64,256 \
        [--quantization nvfp4 | --format fp8-block]

For each batch size: ``batch`` requests of ``--context`` random tokens are prefilled, then
``--steps`` decode steps run under the profiler exactly as the engine runs them (CUDA graphs
unless ``--enforce-eager``). Reports per step: wall time, summed kernel time, the idle gap
between them, kernel time grouped by kernel name, each name's exposed time (``exposed_times``:
what the step waits on it, its wait for the kernel before left out), and a timeline of 60
kernels from a third of the way into the window. ``--disable-pdl`` launches the kernels
without programmatic dependent launch, so that each one's time is its own. Writes
decode_profile_<tag>_<date>.json.

``--prefill-lengths`` profiles prefill instead: as many prompts of each length as one step's
token budget takes (roofline.py's prefill part), after one untimed run of the same.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    LLAMA_8B,
    add_decode_batch,
    build_engine,
    drain,
    greedy,
    random_prompts,
    reset_prefix_cache,
    write_result,
)
from benchmarks.lowbit_decode import FORMATS, model_dir
from benchmarks.moe_decode import unblockable_dense
from kvserve.engine.engine_core import EngineCore


def kernel_spans(prof: torch.profiler.profile) -> list[tuple[str, float, float]]:
    """(name, start, end) of every kernel in the profiled window, in us."""
    return [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA]  # fmt: skip


def kernel_times(prof: torch.profiler.profile) -> tuple[dict[str, float], int]:
    """Summed device time (us) per kernel name over the profiled window, and the number of
    kernels launched."""
    totals: dict[str, float] = defaultdict(float)
    launches = 0
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            totals[evt.name] += evt.device_time
            launches += 1
    return totals, launches


def exposed_times(spans: list[tuple[str, float, float]]) -> tuple[dict[str, float], float]:
    """Each kernel name's exposed time, and the time no kernel ran, from (name, start, end)
    spans (any unit): a kernel's exposed time is how far its end lies past the latest end of
    the kernels that started before it, the time the stream advanced because of it. With
    programmatic dependent launch a kernel's own duration includes its wait for the one
    before; its exposed time does not, so it splits a step into weight streams and the
    dependency chains between them. Exposed times and gaps sum to the window's span."""
    exposed: dict[str, float] = defaultdict(float)
    gaps, frontier = 0.0, None
    for name, start, end in sorted(spans, key=lambda span: span[1]):
        if frontier is None:
            frontier = start
        gaps += max(0.0, start - frontier)
        exposed[name] += max(0.0, end - max(start, frontier))
        frontier = max(frontier, end)
    return dict(exposed), gaps


def timeline(prof: torch.profiler.profile, first: int, count: int) -> list[list]:
    """Kernels ``first`` .. ``first + count`` of the profiled window in launch order: [name (60
    characters), start (us from the first of them), duration (us)]. With programmatic dependent
    launch a kernel starts before the one before it ends; without, the gaps are launch costs."""
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels = sorted(kernels, key=lambda e: e.time_range.start)[first : first + count]
    t0 = kernels[0].time_range.start if kernels else 0
    return [[e.name[:60], round(e.time_range.start - t0, 2), round(e.device_time, 2)]
            for e in kernels]  # fmt: skip


def profile_batch(core: EngineCore, batch: int, context: int, steps: int) -> dict[str, Any]:
    # max_tokens long enough that no request ends inside the window (the first ones start
    # decoding while the last are still prefilling); all are aborted afterwards.
    reqs = add_decode_batch(core, batch, context, 2048, seed=5, min_outputs=4)
    for _ in range(3):
        core.step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for _ in range(steps):
            core.step()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - t) / steps * 1e3
    for r in reqs:
        core.abort_request(r.request_id)
    drain(core)
    reset_prefix_cache(core)
    row = summarize(prof, steps, wall_ms, f"b={batch}")
    # a few layers a third of the way into the first step
    window = timeline(prof, int(row["kernels_per_step"] // 3), 60)
    return {"batch": batch, "context": context} | row | {"timeline_us": window}


def summarize(
    prof: torch.profiler.profile, count: int, wall_ms: float, what: str, unit: str = "step"
) -> dict:
    """Kernel time by name per ``unit`` (``count`` of them in the profile; ``wall_ms`` is per
    unit already)."""
    totals, launches = kernel_times(prof)
    per_unit = {k: v / count / 1e3 for k, v in totals.items()}  # ms
    exposed, gaps = exposed_times(kernel_spans(prof))
    exposed_top = {k: v / count / 1e3 for k, v in sorted(exposed.items(), key=lambda kv: -kv[1])}
    busy = sum(per_unit.values())
    top = dict(sorted(per_unit.items(), key=lambda kv: -kv[1])[:20])
    print(f"{what}: wall {wall_ms:.3f} ms/{unit}, kernels {busy:.3f} ms, "
          f"idle {wall_ms - busy:.3f} ms, {launches / count:.0f} kernels", flush=True)  # fmt: skip
    for name, ms in top.items():
        print(f"    {ms:8.4f} ms  {100 * ms / busy:5.1f}%  {name[:110]}", flush=True)
    print(f"  exposed (no kernel {gaps / count / 1e3:.4f} ms/{unit}):", flush=True)
    for name, ms in list(exposed_top.items())[:10]:
        print(f"    {ms:8.4f} ms  {100 * ms / wall_ms:5.1f}% of wall  {name[:100]}", flush=True)
    return {f"wall_ms_per_{unit}": wall_ms, f"kernel_ms_per_{unit}": busy,
            f"idle_ms_per_{unit}": wall_ms - busy, f"kernels_per_{unit}": launches / count,
            f"top_kernels_ms_per_{unit}": top,
            f"exposed_ms_per_{unit}": dict(list(exposed_top.items())[:20]),
            f"no_kernel_ms_per_{unit}": gaps / count / 1e3}  # fmt: skip


def profile_prefill(core: EngineCore, length: int) -> dict[str, Any]:
    """The prefill of one token budget's worth of ``length``-token prompts (one output each),
    profiled after an unprofiled run of the same (compiles, first-size allocations)."""
    n = max(1, core.config.scheduler.max_num_batched_tokens // length)
    _prefill(core, length, n, "warm-up")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        steps, wall_ms = _prefill(core, length, n, "profiled")
    row = summarize(prof, 1, wall_ms, f"prefill {n}x{length} in {steps} steps", "prefill")
    return {"prompt_len": length, "prompts": n, "steps": steps} | row


def _prefill(core: EngineCore, length: int, n: int, tag: str) -> tuple[int, float]:
    """``n`` random prompts of ``length`` tokens run to their one output: (steps, wall ms)."""
    for i, p in enumerate(random_prompts(n, length, core.model_config.vocab_size, seed=length)):
        core.add_request(f"prefill{length}-{tag}-{i}", p, greedy(1))
    torch.cuda.synchronize()
    t = time.perf_counter()
    steps = 0
    while core.has_unfinished():
        core.step()
        steps += 1
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t) * 1e3
    reset_prefix_cache(core)  # the same prompts again must not hit the cache
    return steps, wall_ms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=LLAMA_8B)
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prefill-lengths", default="", help="profile prefill at these lengths")
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--disable-overlap-schedule", action="store_true")
    ap.add_argument("--disable-pdl", action="store_true", help="kernels one after another")
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--quantization", default=None, help="fp8, nvfp4 or mxfp4 (online)")
    ap.add_argument("--format", default=None, help="a lowbit_decode format, e.g. fp8-block")
    ap.add_argument("--tag", default="h200")
    args = ap.parse_args()
    model, quantization = args.model, args.quantization
    if args.format:
        quantization, qc = FORMATS[args.format]
        model = model_dir(model, unblockable_dense(model, qc), Path(tempfile.mkdtemp()))
    core = build_engine(
        model, max_running_requests=256, enforce_eager=args.enforce_eager,
        disable_overlap_schedule=args.disable_overlap_schedule, quantization=quantization,
        disable_pdl=args.disable_pdl,
    )  # fmt: skip
    if args.prefill_lengths:
        lengths = [int(n) for n in args.prefill_lengths.split(",")]
        rows = [profile_prefill(core, n) for n in lengths]
    else:
        batches = [int(b) for b in args.batches.split(",")]
        rows = [profile_batch(core, b, args.context, args.steps) for b in batches]
    result = {"model": args.model, "quantization": quantization, "format": args.format,
              "enforce_eager": args.enforce_eager, "pdl": not args.disable_pdl,
              "rows": rows}  # fmt: skip
    print(f"wrote {write_result(f'decode_profile_{args.tag}', result, args.out_dir)}")


if __name__ == "__main__":
    main()
