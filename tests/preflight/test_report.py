from __future__ import annotations

from kvserve.preflight.report import exit_code, render_table, verdict
from kvserve.preflight.result import CheckResult, Status

ROWS = [
    CheckResult("gpu: count and model", Status.PASS, "8 x NVIDIA H200", ">= 1"),
    CheckResult(
        "fabric manager: version",
        Status.FAIL,
        "550.54.15",
        "== driver 550.90.07",
        "install nvidia-fabricmanager 550.90.07 to match the driver",
    ),
    CheckResult("host: open files (ulimit -n)", Status.WARN, "1024", ">= 65536", "ulimit -n"),
    CheckResult("ib: port state", Status.SKIP, "no devices under /sys/class/infiniband"),
]


def test_table_has_every_column_and_wraps_long_cells() -> None:
    table = render_table(ROWS)
    lines = table.splitlines()
    assert lines[0].split(" | ")[0].strip() == "check"
    assert [c.strip() for c in lines[0].split("|")] == [
        "check",
        "status",
        "observed",
        "expected",
        "fix",
    ]
    assert any("FAIL" in line and "550.54.15" in line for line in lines)
    fix_lines = [line.split(" | ")[-1] for line in lines[2:] if line.count(" | ") == 4]
    assert " ".join(x.strip() for x in fix_lines if x.strip()).startswith(ROWS[1].fix)
    assert max(len(line) for line in lines) <= 175


def test_verdict_and_exit_code() -> None:
    assert verdict(ROWS).startswith(
        "verdict: NOT READY (1 failed, 1 warnings, 1 passed, 1 skipped)"
    )
    assert "fix fabric manager: version" in verdict(ROWS)
    assert exit_code(ROWS) == 1
    assert verdict(ROWS[2:]).startswith("verdict: READY WITH WARNINGS")
    assert exit_code(ROWS[2:]) == 0
