"""`kvserve eval [report] ...`: accuracy of candidates against a baseline, per task type."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from kvserve import __version__
from kvserve.bench.units import parse_duration
from kvserve.errors import ConfigError
from kvserve.evaluate.builtin import GENERATORS, LANGS
from kvserve.evaluate.collect import RunSettings, collect_target
from kvserve.evaluate.targets.spec import parse_target
from kvserve.evaluate.task_sources import gather_tasks

_EPILOG = """targets:
  [NAME=]URL[,model=ID]                  an OpenAI-compatible server (kvserve, vLLM, SGLang, ...)
  [name=NAME,]model=PATH[,KEY=VALUE...]  a kvserve engine in this process; KEY=VALUE are engine
                                         settings (dtype=bfloat16, quantization=nvfp4, ...)
examples:
  kvserve eval --baseline http://a:8000 --candidate fp8=http://b:8000 --tasks builtin
  kvserve eval --baseline model=DIR --candidate model=DIR,quantization=nvfp4 --tasks my.jsonl
  kvserve eval report runs/eval"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # a one-line ConfigError, not argparse's exit
        raise ConfigError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="kvserve eval",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Compare candidates' outputs with a baseline's, per task type.",
    )
    p.add_argument("--baseline", required=True, help="target spec (see below)")
    p.add_argument("--candidate", action="append", required=True, help="target spec; repeat")
    p.add_argument("--tasks", action="append", help="'builtin' or a JSONL file; repeat")
    p.add_argument("--per-type", type=int, default=20, help="built-in tasks per type")
    p.add_argument("--seed", type=int, default=0, help="built-in task seed")
    p.add_argument("--lang", default=",".join(LANGS), help="built-in languages: en,zh")
    p.add_argument("--types", help=f"built-in types (default all): {','.join(GENERATORS)}")
    p.add_argument(
        "--prompt-endpoint",
        default="completions",
        choices=("completions", "chat"),
        help="where a file row with 'prompt' goes ('messages' always go to chat)",
    )
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--threshold", type=float, default=2.0, help="points of drop to flag")
    p.add_argument("--rouge-floor", type=float, help="judge answerless types: ROUGE-L floor")
    p.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples")
    p.add_argument("--api-key", help="bearer token for every HTTP target")
    p.add_argument("--request-timeout", default="600s")
    p.add_argument("--out", default="runs/eval", help="run directory (default runs/eval)")
    p.add_argument("--cache-dir", help="output cache (default OUT/cache)")
    p.add_argument("--fresh", action="store_true", help="ignore cached outputs")
    p.add_argument("--fail-on-regression", action="store_true", help="exit 1 if any regressed")
    p.add_argument("--quiet", action="store_true")
    return p


def _targets(a: argparse.Namespace) -> list:
    timeout = parse_duration(a.request_timeout, "--request-timeout")
    targets = [parse_target(a.baseline, "--baseline", "baseline", a.api_key, timeout)]
    for i, spec in enumerate(a.candidate, 1):
        targets.append(parse_target(spec, "--candidate", f"candidate{i}", a.api_key, timeout))
    names = [t.name for t in targets]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ConfigError(f"two targets are named {dup!r}: name them (NAME=URL or name=NAME)")
    return targets


def _check(a: argparse.Namespace) -> None:
    for flag, value in (
        ("--per-type", a.per_type),
        ("--max-tokens", a.max_tokens),
        ("--concurrency", a.concurrency),
        ("--resamples", a.resamples),
    ):
        if value < 1:
            raise ConfigError(f"{flag} must be at least 1, got {value}")
    if a.threshold < 0:
        raise ConfigError(f"--threshold must not be negative, got {a.threshold}")


def _meta(
    a: argparse.Namespace,
    base: str,
    cands: list[str],
    stats: dict,
    num_tasks: int,
    bad: list[str],
    langs: tuple[str, ...],
) -> dict:
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "kvserve": __version__,
        "baseline": base,
        "candidates": cands,
        "targets": stats,
        "tasks": a.tasks or ["builtin"],
        "num_tasks": num_tasks,
        "bad_rows": bad,
        "per_type": a.per_type,
        "seed": a.seed,
        "langs": list(langs),
        "max_tokens": a.max_tokens,
        "temperature": 0.0,
        "concurrency": a.concurrency,
        "threshold": a.threshold,
        "rouge_floor": a.rouge_floor,
        "resamples": a.resamples,
    }


def _writable(directory: Path, flag: str) -> None:
    """Fail before any target runs, not at the first output the cache cannot keep."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{flag} {directory}: cannot create it: {exc.strerror}") from None
    if not os.access(directory, os.W_OK):
        raise ConfigError(f"{flag} {directory}: not writable")


def run(a: argparse.Namespace) -> int:
    # Scoring and reporting pull in numpy, nltk (via rouge-score) and matplotlib: imported
    # here, so that a mistyped flag is answered at once.
    from kvserve.evaluate.files import write_run
    from kvserve.evaluate.items import item_row
    from kvserve.evaluate.summary import Judging, summarize

    _check(a)
    targets = _targets(a)
    langs = tuple(x.strip() for x in a.lang.split(",") if x.strip())
    types = tuple(x.strip() for x in a.types.split(",")) if a.types else None
    tasks, bad = gather_tasks(
        a.tasks or ["builtin"], a.per_type, a.seed, langs, types, a.prompt_endpoint
    )
    out = Path(a.out)
    settings = RunSettings(
        a.max_tokens,
        a.concurrency,
        Path(a.cache_dir) if a.cache_dir else out / "cache",
        a.fresh,
        a.quiet,
    )
    _writable(out, "--out")
    _writable(settings.cache_dir, "--cache-dir" if a.cache_dir else "--out")
    outputs, stats = {}, {}
    for target in targets:
        outputs[target.name], stats[target.name] = collect_target(target, tasks, settings)
    base, cands = targets[0].name, [t.name for t in targets[1:]]
    rows = [item_row(t, {n: outputs[n][t.id] for n in outputs}, base, cands) for t in tasks]
    table = summarize(rows, base, cands, Judging(a.threshold, a.rouge_floor, a.resamples))
    meta = _meta(a, base, cands, stats, len(tasks), bad, langs)
    print(write_run(out, meta, table, rows))
    print(f"results in {out}/ (result.json, outputs.jsonl, report.html)", file=sys.stderr)
    regressed = any(c["verdict"] == "regressed" for r in table for c in r["candidates"].values())
    return 1 if a.fail_on_regression and regressed else 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "report":
        p = _Parser(prog="kvserve eval report", description="Re-render a kvserve eval run.")
        p.add_argument("run_dir")
        run_dir = Path(p.parse_args(argv[1:]).run_dir)
        from kvserve.evaluate.files import rerender

        print(rerender(run_dir))
        return 0
    return run(_parser().parse_args(argv))
