"""The terminal table: one block per candidate, a row per task type and ``overall``."""

from __future__ import annotations

from typing import Any

_HEAD = (f"{'type':<16}{'n':>5}  {'scorer':<12}{'base':>7}{'cand':>7}{'delta':>8}  "
         f"{'95% CI':<17}{'ROUGE-L':>8}{'agree':>7}  verdict")  # fmt: skip


def _num(x: float | None, width: int, sign: bool = False) -> str:
    if x is None:
        return f"{'-':>{width}}"
    return f"{x:>+{width}.1f}" if sign else f"{x:>{width}.1f}"


def _ci(ci: list | None) -> str:
    if not ci or ci[0] is None:
        return f"{'-':<17}"
    return f"{f'[{ci[0]:+.1f}, {ci[1]:+.1f}]':<17}"


def _line(row: dict[str, Any], name: str) -> str:
    c = row["candidates"][name]
    agree = "-" if c["agreement"] is None else f"{c['agreement']:.0f}%"
    flag = c["verdict"].upper() if c["verdict"] == "regressed" else c["verdict"]
    return (f"{row['type'][:15]:<16}{row['n']:>5}  {(row['scorer'] or '-')[:11]:<12}"
            f"{_num(row['baseline']['score'], 7)}{_num(c['score'], 7)}"
            f"{_num(c['delta'], 8, sign=True)}  {_ci(c['ci'])}{_num(c['rouge_l'], 8)}"
            f"{agree:>7}  {flag}")  # fmt: skip


def render_table(result: dict[str, Any]) -> str:
    meta, table = result["meta"], result["types"]
    base = meta["baseline"]
    lines = [f"baseline {base}: {meta['targets'][base]['identity']}",
             f"{meta['num_tasks']} tasks, max_tokens {meta['max_tokens']}, greedy; regressed = "
             f"drop > {meta['threshold']:g} points and the 95% interval below 0"]  # fmt: skip
    for name in meta["candidates"]:
        lines += ["", f"candidate {name}: {meta['targets'][name]['identity']}", _HEAD]
        lines += [_line(row, name) for row in table]
        regressed = [r["type"] for r in table if r["candidates"][name]["verdict"] == "regressed"]
        lines.append(f"-> {name}: regressed on {', '.join(regressed)}" if regressed
                     else f"-> {name}: no type regressed")  # fmt: skip
    failed = {n: t["failed"] for n, t in meta["targets"].items() if t.get("failed")}
    if failed:
        shown = ", ".join(f"{n} {k}" for n, k in failed.items())
        lines.append(f"failed requests (scored as wrong; a rerun retries them): {shown}")
    return "\n".join(lines)
