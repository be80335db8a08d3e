"""A/B of ``KVSERVE_*`` settings on one machine: one benchmark command run in fresh processes,
one per side and round, the sides alternating (A, B, A, B, ... and each round in the order of
the one before reversed), so that drift in the GPU's clocks falls on every side.

The settings are read once, at load, so every run is its own process. The command must take
``--out-dir`` and ``--tag`` and write one result JSON there (``moe_decode``, ``lowbit_decode``,
``roofline``, ``decode_profile``, ...); each run gets the tag ``<tag>_<side><round>`` and its file
lands in ``--out-dir`` as ``<benchmark>_<tag>_<side><round>_<date>.json``, so no run replaces
another's. The decode and offline rates found in each file (any ``{"batch": b, "tok_s": r}``
row, and ``output_tok_s``) are gathered per side: every round's value, the median, and the
median's ratio to the first side's; so are prefill rates (``{"prompt_len": n, "tok_s": r}``
rows, as ``prefill_<n>``). Writes env_ab_<tag>_<date>.json.

A side may also run another source tree's kvserve: ``name@TREE:...`` runs the command in TREE
with TREE first on PYTHONPATH (its own benchmark code too), stamped with TREE's commit where it
is a git checkout of its own (``git worktree add ab_base <commit>``), else ``tree:<name>``. That
is the A/B of a code change: the old tree beside the new, alternating on one machine.

    python -m benchmarks.env_ab --side plain:KVSERVE_GATED_GEMV=0 --side gated: --rounds 2 \
        --tag s43_glm_gated --out-dir $OUT -- python -m benchmarks.moe_decode \
        --model benchmarks/configs/glm-4.5-air --formats nvfp4 --batches 1
    git worktree add ab_base e06e46b
    python -m benchmarks.env_ab --side base@ab_base: --side head: --rounds 2 --tag fp4_tiles \
        --out-dir $OUT -- python -m benchmarks.lowbit_decode --formats nvfp4 --batches 64
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import tree_env, write_result
from kvserve.env_settings import SETTINGS


@dataclass(frozen=True)
class Side:
    name: str
    env: dict[str, str]
    tree: Path | None = None  # another source tree's kvserve; None: this checkout's


def parse_side(text: str) -> Side:
    """``name[@TREE]:VAR=value,VAR=value`` (nothing after the colon: the environment as it
    is)."""
    head, _, assignments = text.partition(":")
    name, at, tree_text = head.partition("@")
    if not name or not name.isidentifier():
        raise ValueError(f"--side {text!r}: expected name[@TREE]:VAR=value,... with a plain name")
    tree = Path(tree_text).resolve() if at else None
    if tree is not None and not (tree / "kvserve" / "__init__.py").is_file():
        raise ValueError(f"--side {text!r}: {tree_text!r} is not a kvserve source tree")
    env = {}
    for item in filter(None, assignments.split(",")):
        var, eq, value = item.partition("=")
        if not eq or not var.startswith("KVSERVE_"):
            raise ValueError(f"--side {text!r}: {item!r} is not KVSERVE_NAME=value")
        if var not in {s.name for s in SETTINGS}:
            raise ValueError(f"--side {text!r}: {var} is not a kvserve setting")
        env[var] = value
    return Side(name, env, tree)


def run_order(sides: list[str], rounds: int) -> list[tuple[str, int]]:
    """(side, round) in run order: round r in the order of round r - 1 reversed."""
    order, names = [], list(sides)
    for r in range(1, rounds + 1):
        order += [(name, r) for name in names]
        names.reverse()
    return order


def rates_of(
    record: Any, found: dict[str, float] | None = None, prefix: str = ""
) -> dict[str, float]:
    """Every ``{"batch": b, "tok_s": r}`` row as ``decode_b<b>`` (the first of each batch) and
    ``output_tok_s`` as ``offline``, wherever they sit in a result; under a ``formats`` map each
    format's rates are named ``<format>_decode_b<b>`` and ``<format>_offline``."""
    found = {} if found is None else found
    if isinstance(record, dict):
        if "batch" in record and "tok_s" in record:
            found.setdefault(f"{prefix}decode_b{record['batch']}", float(record["tok_s"]))
        if "prompt_len" in record and "tok_s" in record:
            found.setdefault(f"{prefix}prefill_{record['prompt_len']}", float(record["tok_s"]))
        if "output_tok_s" in record:
            found.setdefault(f"{prefix}offline", float(record["output_tok_s"]))
        for key, value in record.items():
            if key == "formats" and isinstance(value, dict):
                for name, entry in value.items():
                    rates_of(entry, found, f"{prefix}{name}_")
            else:
                rates_of(value, found, prefix)
    elif isinstance(record, list):
        for value in record:
            rates_of(value, found, prefix)
    return found


def run_side(command: list[str], side: Side, tag: str, out_dir: Path) -> dict:
    """One run; its result file's rates (empty, with the exit code, when it failed)."""
    before = set(out_dir.glob("*.json"))
    args = [*command, "--out-dir", str(out_dir.resolve()), "--tag", tag]
    env = {**os.environ, **(tree_env(side.tree) if side.tree else {}), **side.env}
    proc = subprocess.run(args, env=env, cwd=side.tree, capture_output=True, text=True)
    new = sorted(set(out_dir.glob("*.json")) - before)
    if proc.returncode or len(new) != 1:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        return {"tag": tag, "exit_code": proc.returncode, "files": [p.name for p in new],
                "output_tail": tail}  # fmt: skip
    return {"tag": tag, "file": new[0].name, "rates": rates_of(json.loads(new[0].read_text()))}


def summarize(runs: dict[str, list[dict]]) -> dict[str, dict[str, Any]]:
    """Per side and rate: the rounds' values, their median, and its ratio to the first side's."""
    first = next(iter(runs))
    out: dict[str, dict[str, Any]] = {}
    for side, side_runs in runs.items():
        keys = sorted({k for r in side_runs for k in r.get("rates", {})})
        out[side] = {}
        for key in keys:
            values = [r["rates"][key] for r in side_runs if key in r.get("rates", {})]
            base = [r["rates"][key] for r in runs[first] if key in r.get("rates", {})]
            median = statistics.median(values)
            ratio = median / statistics.median(base) if base else None
            out[side][key] = {"values": values, "median": median, "ratio_to_first": ratio}
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", action="append", required=True, help="name[@TREE]:VAR=value,...")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--out-dir", default="benchmarks/results")
    args = ap.parse_args(argv[:split])
    command = argv[split + 1 :]
    try:
        sides = {side.name: side for side in map(parse_side, args.side)}
    except ValueError as exc:
        ap.error(str(exc))
    if len(sides) < 2 or not command or args.rounds < 1:
        ap.error("give two or more --side, --rounds >= 1, and the command after --")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    for side, r in run_order(list(sides), args.rounds):
        run = run_side(command, sides[side], f"{args.tag}_{side}{r}", out_dir)
        runs[side].append(run)
        print(f"{side} round {r}: {run.get('rates') or run}", flush=True)
        summary = summarize(runs)
        record = {"command": command, "sides": {n: s.env for n, s in sides.items()},
                  "trees": {n: str(s.tree) for n, s in sides.items() if s.tree},
                  "runs": runs, "summary": summary}  # fmt: skip
        path = write_result(f"env_ab_{args.tag}", record, out_dir)
    for side, rates in summary.items():
        shown = ", ".join(f"{k} {v['median']:.1f} (x{v['ratio_to_first']:.3f})"
                          for k, v in rates.items() if v["ratio_to_first"])  # fmt: skip
        print(f"{side}: {shown}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
