"""make test's case cap for the interpreted kernel tests (tests/interpreted_cases.py): its picks,
and the plugin in a real pytest run, after -k."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.interpreted_cases import spread_picks

ROOT = Path(__file__).resolve().parents[1]


def test_picks_keep_the_ends_and_spread_between() -> None:
    assert spread_picks(10, 4) == [0, 3, 6, 9]
    assert spread_picks(5, 3) == [0, 2, 4]
    assert spread_picks(3, 4) == [0, 1, 2]
    assert spread_picks(7, 1) == [0]
    assert spread_picks(0, 4) == []


def test_the_cap_applies_to_each_test_after_k(tmp_path: Path) -> None:
    (tmp_path / "test_cases.py").write_text(
        "import pytest\n"
        "@pytest.mark.parametrize('n', range(10))\n"
        "def test_many(n): pass\n"
        "@pytest.mark.parametrize('n', range(2))\n"
        "def test_few(n): pass\n"
        "def test_plain(): pass\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
         "-p", "tests.interpreted_cases", "--cases-per-test", "3", "-k", "not many[5]",
         "--collect-only", str(tmp_path / "test_cases.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    ids = [line.split("::")[1] for line in run.stdout.splitlines() if "::" in line]
    # test_many's 9 cases left by -k (0-4, 6-9): the first, the middle one (4) and the last
    assert ids == ["test_many[0]", "test_many[4]", "test_many[9]", "test_few[0]", "test_few[1]",
                   "test_plain"]  # fmt: skip
