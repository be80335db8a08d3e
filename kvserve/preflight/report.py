"""The report: a wrapped text table, a one-line verdict, and the JSON document."""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

from kvserve.preflight.facts import NodeFacts
from kvserve.preflight.options import PreflightOptions
from kvserve.preflight.result import CheckResult, Status

# column -> width; long cells wrap inside their column
COLUMNS = (("check", 30), ("status", 6), ("observed", 46), ("expected", 32), ("fix", 44))


def _cells(row: CheckResult) -> list[str]:
    fix = row.fix if row.status in (Status.WARN, Status.FAIL) else ""
    return [row.name, row.status.value.upper(), row.observed, row.expected, fix]


def render_table(rows: list[CheckResult]) -> str:
    header = " | ".join(name.ljust(width) for name, width in COLUMNS).rstrip()
    lines = [header, "-" * len(header)]
    for row in rows:
        wrapped = [
            textwrap.wrap(text, width, break_on_hyphens=False) or [""]
            for text, (_, width) in zip(_cells(row), COLUMNS, strict=True)
        ]
        for i in range(max(len(w) for w in wrapped)):
            parts = [
                (w[i] if i < len(w) else "").ljust(width)
                for w, (_, width) in zip(wrapped, COLUMNS, strict=True)
            ]
            lines.append(" | ".join(parts).rstrip())
    return "\n".join(lines)


def counts(rows: list[CheckResult]) -> dict[str, int]:
    seen = Counter(r.status.value for r in rows)
    return {s.value: seen.get(s.value, 0) for s in Status}


def verdict(rows: list[CheckResult]) -> str:
    n = counts(rows)
    summary = f"{n['fail']} failed, {n['warn']} warnings, {n['pass']} passed, {n['skip']} skipped"
    if n["fail"]:
        failed = ", ".join(r.name for r in rows if r.status is Status.FAIL)
        return f"verdict: NOT READY ({summary}): fix {failed}"
    if n["warn"]:
        return f"verdict: READY WITH WARNINGS ({summary})"
    return f"verdict: READY ({summary})"


def exit_code(rows: list[CheckResult]) -> int:
    return 1 if any(r.status is Status.FAIL for r in rows) else 0


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def to_json(rows: list[CheckResult], facts: NodeFacts, opts: PreflightOptions) -> str:
    from kvserve import __version__

    doc = {
        "kvserve_version": __version__,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "verdict": verdict(rows),
        "counts": counts(rows),
        "options": dataclasses.asdict(opts),
        "checks": [r.to_dict() for r in rows],
        "facts": dataclasses.asdict(facts),
    }
    return json.dumps(doc, indent=2, default=_jsonable)
