"""`kvserve eval` bad input: one line on stderr, exit code 2, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import run_kvserve

from kvserve.errors import ConfigError
from kvserve.evaluate.targets.spec import parse_target


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--baseline", "garbage", "--candidate", "x=http://a:1"], "expected [NAME=]URL"),
        (["--baseline", "http://127.0.0.1:9", "--candidate", "baseline=http://127.0.0.1:9"],
         "two targets are named"),
        (["--baseline", "http://a:1", "--candidate", "b=http://b:1", "--per-type", "0"],
         "--per-type must be at least 1"),
        (["--baseline", "http://127.0.0.1:9", "--candidate", "b=http://127.0.0.1:9",
          "--tasks", "missing.jsonl"], "no such file"),
        (["report", "/nonexistent-eval-run"], "no result.json"),
        (["--candidate", "b=http://127.0.0.1:9"], "required: --baseline"),
        (["--baseline", "http://127.0.0.1:9"], "required: --candidate"),
        (["--baseline", "http://127.0.0.1:9", "--candidate", "b=http://127.0.0.1:9",
          "--types", "arithmetic,nope"], "unknown built-in language or type: nope"),
        (["--baseline", "http://127.0.0.1:9", "--candidate", "b=http://127.0.0.1:9",
          "--lang", "fr"], "unknown built-in language or type: fr"),
        (["--baseline", "http://a:1,dtype=x", "--candidate", "b=http://b:1"],
         "unknown option 'dtype'"),
        (["--baseline", "http://a:1", "--candidate", "b=http://b:1", "--request-timeout", "x"],
         "--request-timeout"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line(args: list[str], message: str) -> None:
    run = run_kvserve("eval", *args)
    assert run.returncode == 2, run.stderr
    assert message in run.stderr and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_unreachable_server_is_one_line(tmp_path: Path) -> None:
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps({"type": "x", "prompt": "hi"}) + "\n{broken\n")
    targets = ("--baseline", "http://127.0.0.1:9", "--candidate", "b=http://127.0.0.1:9")
    run = run_kvserve("eval", *targets, "--tasks", str(tasks), "--out", str(tmp_path))
    assert run.returncode == 2
    assert f"{tasks}:2: not JSON" in run.stderr  # the bad row, then the run goes on
    assert "cannot reach http://127.0.0.1:9" in run.stderr and "Traceback" not in run.stderr


def test_unwritable_out_is_one_line_before_any_target_runs(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    targets = ("--baseline", "http://127.0.0.1:9", "--candidate", "b=http://127.0.0.1:9")
    run = run_kvserve("eval", *targets, "--out", str(blocker / "run"))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert f"--out {blocker / 'run'}: cannot create it" in run.stderr  # not "cannot reach"
    assert len(run.stderr.strip().splitlines()) == 1


def test_target_specs() -> None:
    http = parse_target("fp8=http://b:8000/,model=m,api_key=k", "--candidate", "c1")
    assert (http.name, http.base_url, http.model, http.api_key) == (
        "fp8",
        "http://b:8000",
        "m",
        "k",
    )
    engine = parse_target("model=/m,quantization=nvfp4,max-running-requests=8,enforce_eager=true",
                          "--candidate", "c1")  # fmt: skip
    assert engine.model == "/m" and engine.name == "nvfp4"
    assert engine.settings == {"quantization": "nvfp4", "max_running_requests": 8,
                               "enforce_eager": True}  # fmt: skip
    assert parse_target("name=b,model=bundled", "--baseline", "baseline").model is None
    assert parse_target("model=bundled,dtype=bfloat16", "--candidate", "c2").name == "bfloat16"
    assert parse_target("model=/m,page_size=32", "--candidate", "c2").name == "c2"
    with pytest.raises(ConfigError, match="unknown option 'dtype'"):
        parse_target("http://a:1,dtype=x", "--candidate", "c")
