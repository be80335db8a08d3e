"""kvserve's ``KVSERVE_*`` settings: one table (``kvserve.env_settings``) that the source, the
README and ``kvserve preflight`` agree with; every reader refuses a value it cannot take."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from cli_runner import run_kvserve

from kvserve.env_settings import SETTINGS, read_setting, settings_set
from kvserve.preflight.checks.settings import check_settings
from kvserve.preflight.probes.settings import probe_settings
from kvserve.preflight.result import Status

ROOT = Path(__file__).parents[2]
NOT_SETTINGS = {"KVSERVE_NCCL_RESULT"}  # the NCCL worker's output tag, not a variable
BY_NAME = {s.name: s for s in SETTINGS}


def test_every_name_the_package_reads_is_in_the_table_and_the_readme() -> None:
    source = "\n".join(p.read_text() for p in (ROOT / "kvserve").rglob("*.py"))
    named = set(re.findall(r"KVSERVE_[A-Z0-9_]+", source)) - NOT_SETTINGS
    assert named == set(BY_NAME)
    readme = (ROOT / "README.md").read_text()
    assert [n for n in BY_NAME if f"`{n}`" not in readme] == []


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.reader], ids=lambda s: s.name)
def test_each_reader_takes_its_default_and_refuses_a_bad_value(
    setting, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    monkeypatch.delenv(setting.name, raising=False)
    assert read_setting(setting) is None
    monkeypatch.setenv(setting.name, "bogus")
    problem = read_setting(setting)
    assert problem is not None and problem.startswith(f"{setting.name}='bogus'")


def test_preflight_fails_a_refused_value_and_names_a_misspelt_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("KVSERVE_")]:
        monkeypatch.delenv(name)
    assert check_settings(probe_settings())[0].observed == "none set: every default"
    env = {
        "KVSERVE_GATED_GEMV": "yes",
        "KVSERVE_GATED_GEMM": "1",
        "KVSERVE_BF16_GEMV_ROWS": "2",
        "KVSERVE_API_KEY": "sekret",
        "KVSERVE_MOE_CONFIG_DIR": str(tmp_path / "none"),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    rows = check_settings(probe_settings())
    by_status = {s: [r for r in rows if r.status is s] for s in Status}
    assert [r.observed for r in by_status[Status.FAIL]] == [
        "KVSERVE_GATED_GEMV='yes': expected 0 or 1"
    ]
    warned = " | ".join(f"{r.observed} {r.fix}" for r in by_status[Status.WARN])
    assert "did you mean KVSERVE_GATED_GEMV?" in warned and "is not a directory" in warned
    (passed,) = by_status[Status.PASS]
    assert passed.observed == "KVSERVE_API_KEY=<set>, KVSERVE_BF16_GEMV_ROWS=2"
    assert "sekret" not in json.dumps([r.to_dict() for r in rows])
    assert settings_set()["KVSERVE_API_KEY"] == "<set>"  # as result files record it


def test_preflight_cli_reports_a_bad_setting_as_a_failed_check(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    env = {**os.environ, "KVSERVE_DIST_TIMEOUT_S": "soon"}
    proc = run_kvserve("preflight", "--json", str(out), env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    row = next(c for c in json.loads(out.read_text())["checks"] if c["status"] == "fail")
    assert row["name"] == "kvserve: settings"
    assert row["observed"] == "KVSERVE_DIST_TIMEOUT_S='soon': expected a number of seconds above 0"


def test_the_engine_logs_the_settings_it_started_with(
    tiny_model_dir, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:  # noqa: ANN001
    """The startup log names each setting set in the environment (the key hidden)."""
    from kvserve import LLM

    monkeypatch.setenv("KVSERVE_GATED_GEMV", "0")
    monkeypatch.setenv("KVSERVE_API_KEY", "sekret")
    with caplog.at_level("INFO", logger="kvserve"):
        LLM(model=str(tiny_model_dir("LlamaForCausalLM")), device="cpu", max_total_tokens=256)
    line = next(r.getMessage() for r in caplog.records if "settings from" in r.getMessage())
    assert "KVSERVE_GATED_GEMV=0" in line and "KVSERVE_API_KEY=<set>" in line
    assert "sekret" not in caplog.text
