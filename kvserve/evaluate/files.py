"""A run directory: result.json (settings, per-target stats, the per-type table),
outputs.jsonl (every task with every target's output and scores), report.html."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from kvserve.bench.report_html import render
from kvserve.errors import ConfigError
from kvserve.evaluate.report_text import render_table
from kvserve.evaluate.worst import side_by_side, worst_items


def json_safe(obj: Any) -> Any:
    """NaN (a figure with nothing to average) -> null; floats rounded for reading."""
    if isinstance(obj, float):
        return None if math.isnan(obj) else round(obj, 4)
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def write_run(out: Path, meta: dict, table: list[dict], rows: list[dict]) -> str:
    out.mkdir(parents=True, exist_ok=True)
    result = json_safe({"meta": meta, "types": table})
    (out / "result.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    with open(out / "outputs.jsonl", "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    return write_report(out, result, rows)


def write_report(out: Path, result: dict, rows: list[dict]) -> str:
    from kvserve.evaluate.plot import delta_chart  # matplotlib: only when a report is drawn

    text = render_table(result)
    meta = result["meta"]
    chart = delta_chart(result, out / "deltas.png")
    extra: dict[str, str] = {}
    for cand in meta["candidates"]:
        for row in result["types"]:
            if row["type"] != "overall" and row["candidates"][cand]["verdict"] == "regressed":
                items = worst_items(rows, row["type"], meta["baseline"], cand)
                extra[f"Worst examples: {cand} on {row['type']}"] = side_by_side(
                    items, meta["baseline"], cand
                )
    page = render("kvserve eval", text, [chart], extra)
    (out / "report.html").write_text(page, encoding="utf-8")
    return text


def rerender(out: Path) -> str:
    """``kvserve eval report DIR``: the table and report.html again from the saved files."""
    if not (out / "result.json").is_file():
        raise ConfigError(f"{out}: no result.json (not a kvserve eval run directory)")
    try:
        result = json.loads((out / "result.json").read_text(encoding="utf-8"))
        lines = (out / "outputs.jsonl").read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{out}: cannot read the run: {exc}") from None
    return write_report(out, result, rows)
