"""Accuracy per task type of the bundled model quantized online, against the unquantized
model (float32 on CPU): ``kvserve eval`` over the built-in tasks with in-process engine targets,
plus the time per 1,000 prompts.

    .venv/bin/python -m benchmarks.eval_bundled [--per-type 10] [--max-tokens 64] \\
        [--candidate fp8=quantization=fp8] [--candidate bf16=dtype=bfloat16]

Without --candidate: fp8, nvfp4 and mxfp4. Each candidate is one ``kvserve eval`` call into
the same run directory (the baseline's outputs come from its cache after the first), with the
load average sampled while it runs; a last call with every candidate (all from the cache)
gives the combined table. Engines are built one at a time in this process (no server start:
on the shared 2-core machine a server took minutes to come up); the time to build each is
kept apart from the time to answer. Writes benchmarks/results/eval_bundled_<date>.json (each
candidate's per-type table: task score, delta with its 95% interval, ROUGE-L and agreement
against the baseline, verdict; per target the seconds for its prompts, scaled to 1,000
prompts, and the load average) and a .md beside it with the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
from pathlib import Path

from benchmarks.common import write_result
from kvserve.evaluate.cli import main as eval_main
from kvserve.evaluate.report_text import render_table

_ROW_KEYS = ("score", "delta", "ci", "rouge_l", "agreement", "verdict")
_DEFAULT = ["fp8=quantization=fp8", "nvfp4=quantization=nvfp4", "mxfp4=quantization=mxfp4"]
_BASELINE = "name=baseline,model=bundled,device=cpu"


def _candidates(specs: list[str]) -> dict[str, str]:
    """NAME=SETTING=VALUE[,SETTING=VALUE...] -> name: the kvserve eval engine target spec."""
    out = {}
    for spec in specs:
        name, sep, settings = spec.partition("=")
        if not sep or not name or "=" not in settings:
            raise SystemExit(f"--candidate {spec!r}: expected NAME=SETTING=VALUE[,...]")
        out[name] = f"name={name},model=bundled,device=cpu,{settings}"
    return out


class LoadSampler:
    """The 1-minute load average every few seconds while a block runs (the CPU is shared)."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s, self.samples = every_s, [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict:
        s = self.samples
        return {"load_1m_mean": round(sum(s) / len(s), 2), "load_1m_min": round(min(s), 2),
                "load_1m_max": round(max(s), 2), "samples": len(s)}  # fmt: skip


def _table(result: dict, name: str) -> list[dict]:
    rows = result["types"]
    return [{"type": r["type"], "n": r["n"], "scorer": r["scorer"],
             "baseline": r["baseline"]["score"],
             **{k: r["candidates"][name][k] for k in _ROW_KEYS}} for r in rows]  # fmt: skip


def _timing(stats: dict, load: dict) -> dict:
    answering = stats["seconds"] - stats.get("load_seconds", 0.0)
    return {
        "prompts": stats["sent"],
        "engine_build_seconds": stats.get("load_seconds"),
        "answer_seconds": round(answering, 1),
        "output_tokens": stats["completion_tokens"],
        "seconds_per_1000_prompts": round(1000 * answering / stats["sent"], 1),
        "output_tok_per_s": round(stats["completion_tokens"] / answering, 1),
        **load,
    }


def _evaluate(a: argparse.Namespace, specs: list[str], run_dir: str) -> dict:
    argv = ["--baseline", _BASELINE, "--tasks", "builtin", "--per-type", str(a.per_type),
            "--max-tokens", str(a.max_tokens), "--concurrency", str(a.concurrency),
            "--out", run_dir, "--quiet"]  # fmt: skip
    for spec in specs:
        argv += ["--candidate", spec]
    eval_main(argv)
    return json.loads((Path(run_dir) / "result.json").read_text())


def _run(a: argparse.Namespace, cands: dict[str, str]) -> dict:
    """Each candidate in turn (timed, load sampled), then all together from the cache."""
    timing = {}
    run_dir = a.run_dir or tempfile.mkdtemp(prefix="eval_bundled-")
    print(f"run directory (kvserve eval's files and output cache): {run_dir}", flush=True)
    for spec in cands.values():
        with LoadSampler() as load:
            result = _evaluate(a, [spec], run_dir)
        for target, stats in result["meta"]["targets"].items():
            if stats["sent"]:  # the baseline's prompts went out with the first candidate
                timing[target] = _timing(stats, load.summary())
    result = _evaluate(a, list(cands.values()), run_dir)
    return {"tables": {n: _table(result, n) for n in cands}, "timing": timing,
            "meta": result["meta"], "text": render_table(result)}  # fmt: skip


def _num(x: float | None, sign: bool = False) -> str:
    return "-" if x is None else (f"{x:+.1f}" if sign else f"{x:.1f}")


def markdown(payload: dict) -> str:
    s = payload["settings"]
    lines = [f"# kvserve eval: bundled model, float32 baseline vs online quantization "
             f"({payload['date'][:10]}, commit {payload['commit']})", "",
             f"`{payload['command']}`: {s['num_tasks']} built-in tasks ({s['per_type']} per "
             f"type, languages {'/'.join(s['langs'])}), greedy, max_tokens {s['max_tokens']}. "
             f"Regressed = drop > {s['threshold']:g} points and the paired-bootstrap 95% "
             "interval below 0.", "",
             "| type | n | scorer | base | " + " | ".join(
                 f"{c} score | {c} delta [95% CI] | {c} ROUGE-L | {c} agree | {c} verdict"
                 for c in payload["tables"]) + " |",
             "|---|---|---|---|" + "---|" * 5 * len(payload["tables"])]  # fmt: skip
    first = next(iter(payload["tables"].values()))
    for i, row in enumerate(first):
        cells = [row["type"], str(row["n"]), row["scorer"] or "-", _num(row["baseline"])]
        for table in payload["tables"].values():
            r = table[i]
            ci = "" if r["ci"][0] is None else f" [{r['ci'][0]:+.1f}, {r['ci'][1]:+.1f}]"
            agree = "-" if r["agreement"] is None else f"{r['agreement']:.0f}%"
            cells += [_num(r["score"]), _num(r["delta"], sign=True) + ci,
                      _num(r["rouge_l"]), agree, r["verdict"]]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| target | prompts | answer s | s per 1,000 prompts | output tok/s | "
              "load avg 1 min (mean / max) |", "|---|---|---|---|---|---|"]  # fmt: skip
    for name, t in payload["timing"].items():
        lines.append(f"| {name} | {t['prompts']} | {t['answer_seconds']:.0f} | "
                     f"{t['seconds_per_1000_prompts']:,.0f} | {t['output_tok_per_s']} | "
                     f"{t['load_1m_mean']} / {t['load_1m_max']} |")  # fmt: skip
    return "\n".join(lines + ["", payload["timing_note"], ""])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--per-type", type=int, default=10)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--candidate", action="append", help="NAME=SETTING=VALUE[,...]; repeat")
    p.add_argument("--out-dir", default=None, help="where the JSON and .md go")
    p.add_argument("--run-dir", help="kvserve eval's run directory (default: a new temp dir)")
    a = p.parse_args()
    cands = _candidates(a.candidate or _DEFAULT)
    run = _run(a, cands)
    meta = run["meta"]
    payload = {
        "command": f"python -m benchmarks.eval_bundled --per-type {a.per_type} --max-tokens "
                   f"{a.max_tokens} --concurrency {a.concurrency} " + " ".join(
                       f"--candidate {n}={spec.split(',', 3)[3]}" for n, spec in cands.items()),
        "model": "bundled SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to float32)",
        "baseline": _BASELINE, "candidates": cands,
        "settings": {k: meta[k] for k in ("per_type", "seed", "langs", "max_tokens",
                                          "concurrency", "threshold", "num_tasks")},
        "tables": run["tables"], "timing": run["timing"], "terminal_table": run["text"],
        "timing_note": "seconds per 1,000 prompts = seconds spent answering (engine build "
                       "excluded) / prompts x 1000, in-process engine, greedy, batches of "
                       "--concurrency prompts, on this 2-core CPU shared with other helpers' "
                       "tests and a niced soak (load average sampled every 5 s while each "
                       "target ran): pessimistic. On CPU every format runs its reference path "
                       "(weights dequantized once to float32), so the formats' times differ by "
                       "load and output length, not by kernel.",
    }  # fmt: skip
    path = write_result("eval_bundled", payload, a.out_dir)
    full = json.loads(path.read_text())
    path.with_suffix(".md").write_text(markdown(full))
    print(f"wrote {path} and {path.with_suffix('.md').name}")


if __name__ == "__main__":
    main()
