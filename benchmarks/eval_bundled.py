"""Accuracy per task type of the bundled model under other engine settings: ``kvserve eval``
over the built-in tasks, the unquantized baseline (float32 on CPU) against candidates started
as real ``kvserve serve`` processes with other flags, plus the time per 1,000 prompts.

    .venv/bin/python -m benchmarks.eval_bundled [--per-type 10] [--max-tokens 64] \\
        [--candidate bf16="--dtype bfloat16"] [--candidate nvfp4="--quantization nvfp4"]

Writes benchmarks/results/eval_bundled_<date>.json: each candidate's per-type table (task
score, delta with its 95% interval, ROUGE-L and agreement against the baseline, verdict) and,
per target, the measured seconds for its prompts at the run's concurrency, extrapolated
linearly to 1,000 prompts (the run itself is kept small: the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import shlex
import tempfile
from pathlib import Path

from benchmarks.common import write_result
from kvserve.evaluate.cli import main as eval_main
from kvserve.server.launch import launch_server

_ROW_KEYS = ("score", "delta", "ci", "rouge_l", "agreement", "verdict")


def _candidates(specs: list[str]) -> dict[str, list[str]]:
    out = {}
    for spec in specs:
        name, sep, flags = spec.partition("=")
        if not sep or not name:
            raise SystemExit(f'--candidate {spec!r}: expected NAME="serve flags"')
        out[name] = shlex.split(flags)
    return out


def _tables(result: dict) -> dict[str, list[dict]]:
    return {
        name: [{"type": r["type"], "n": r["n"], "scorer": r["scorer"],
                "baseline": r["baseline"]["score"],
                **{k: r["candidates"][name][k] for k in _ROW_KEYS}} for r in result["types"]]
        for name in result["meta"]["candidates"]
    }  # fmt: skip


def _timing(result: dict) -> dict[str, dict]:
    out = {}
    for name, t in result["meta"]["targets"].items():
        if t["sent"]:
            out[name] = {
                "prompts": t["sent"],
                "seconds": t["seconds"],
                "output_tokens": t["completion_tokens"],
                "seconds_per_1000_prompts": round(1000 * t["seconds"] / t["sent"], 1),
                "output_tok_per_s": round(t["completion_tokens"] / t["seconds"], 1),
            }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--per-type", type=int, default=10)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--candidate", action="append", help='NAME="kvserve serve flags"')
    p.add_argument("--out-dir", default=None, help="where the JSON goes")
    a = p.parse_args()
    cands = _candidates(a.candidate or ["bf16=--dtype bfloat16"])
    servers = {"baseline": launch_server(), **{n: launch_server(*f) for n, f in cands.items()}}
    try:
        urls = {name: s.wait_healthy(1200) for name, s in servers.items()}
        with tempfile.TemporaryDirectory() as tmp:
            argv = ["--baseline", urls["baseline"], "--tasks", "builtin", "--per-type",
                    str(a.per_type), "--max-tokens", str(a.max_tokens), "--concurrency",
                    str(a.concurrency), "--out", tmp]  # fmt: skip
            for name in cands:
                argv += ["--candidate", f"{name}={urls[name]}"]
            eval_main(argv)
            result = json.loads((Path(tmp) / "result.json").read_text())
    finally:
        for s in servers.values():
            s.stop()
    meta = result["meta"]
    payload = {
        "command": "python -m benchmarks.eval_bundled " + " ".join(
            f"--candidate {shlex.quote(f'{n}={shlex.join(f)}')}" for n, f in cands.items()),
        "model": "bundled SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized)",
        "baseline_flags": [], "candidate_flags": cands,
        "settings": {k: meta[k] for k in ("per_type", "seed", "langs", "max_tokens",
                                          "concurrency", "threshold", "num_tasks")},
        "tables": _tables(result), "timing": _timing(result),
        "timing_note": "seconds_per_1000_prompts = measured seconds / prompts x 1000, at the "
                       "run's concurrency through HTTP; the run has only per_type x 7 prompts",
    }  # fmt: skip
    print(f"wrote {write_result('eval_bundled', payload, a.out_dir)}")


if __name__ == "__main__":
    main()
