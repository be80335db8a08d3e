"""Your own prompts from JSONL: good rows load, each bad row is reported with its line number
and skipped, the rest still run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvserve.errors import ConfigError
from kvserve.evaluate.task_file import load_task_file
from kvserve.evaluate.task_sources import gather_tasks

GOOD = [
    {"type": "lookup", "prompt": "Capital of France?", "answer": "Paris"},
    {"type": "math", "messages": [{"role": "user", "content": "2+2?"}], "answer": 4,
     "scorer": "number", "id": "m1"},
    {"type": "summary", "prompt": "Summarize: the sky is blue.", "lang": "en"},
]  # fmt: skip
BAD = [
    "{not json",
    json.dumps(["a", "list"]),
    json.dumps({"prompt": "no type"}),
    json.dumps({"type": "x", "prompt": "p", "messages": [{"role": "user", "content": "m"}]}),
    json.dumps({"type": "x"}),
    json.dumps({"type": "x", "messages": [{"role": "robot", "content": "hi"}]}),
    json.dumps({"type": "x", "prompt": "p", "scorer": "fuzzy", "answer": "a"}),
    json.dumps({"type": "x", "prompt": "p", "scorer": "number", "answer": "many"}),
    json.dumps({"type": "x", "prompt": "p", "scorer": "regex", "answer": "(open"}),
    json.dumps({"type": "x", "prompt": "p", "scorer": "exact"}),
    json.dumps({"type": "x", "prompt": "p", "id": "m1"}),  # duplicate id
]
WHY = [
    "not JSON",
    "expected a JSON object",
    "'type'",
    "exactly one",
    "exactly one",
    "role",
    "unknown scorer",
    "numeric",
    "bad pattern",
    "needs an 'answer'",
    "duplicate id",
]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_good_rows_load(tmp_path: Path) -> None:
    tasks, problems = load_task_file(_write(tmp_path / "t.jsonl", [json.dumps(r) for r in GOOD]))
    assert problems == []
    assert [t.type for t in tasks] == ["lookup", "math", "summary"]
    assert tasks[0].scorer == "exact" and tasks[0].endpoint == "completions"
    assert tasks[1].id == "m1" and tasks[1].endpoint == "chat" and tasks[1].scorer == "number"
    assert tasks[2].scorer is None and tasks[2].answer is None


def test_bad_rows_are_reported_by_line_and_skipped(tmp_path: Path) -> None:
    lines = [json.dumps(GOOD[0]), json.dumps(GOOD[1]), "", *BAD, json.dumps(GOOD[2])]
    path = _write(tmp_path / "t.jsonl", lines)
    tasks, problems = load_task_file(path)
    assert [t.type for t in tasks] == ["lookup", "math", "summary"]
    assert len(problems) == len(BAD)
    for k, (problem, why) in enumerate(zip(problems, WHY, strict=True)):
        assert problem.startswith(f"{path}:{k + 4}: "), problem
        assert why in problem, problem


def test_prompt_rows_can_go_to_chat(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [json.dumps(GOOD[0])])
    (task,), _ = load_task_file(path, prompt_endpoint="chat")
    assert task.endpoint == "chat"
    assert task.messages == [{"role": "user", "content": "Capital of France?"}]


def test_only_bad_rows_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = _write(tmp_path / "t.jsonl", BAD[:2])
    with pytest.raises(ConfigError, match="no tasks to run .2 bad rows"):
        gather_tasks([str(path)], 1, 0, ("en",), None, "completions")
    assert capsys.readouterr().err.count("skipped bad row") == 2
    with pytest.raises(ConfigError, match="no such file"):
        load_task_file(tmp_path / "missing.jsonl")
