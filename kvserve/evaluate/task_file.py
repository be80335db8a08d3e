"""Your own prompts: a JSONL file, one task per line.

Each line is an object with ``type`` (the group it is reported under), ``prompt`` (text) or
``messages`` (a chat), and optionally ``answer`` with ``scorer`` (one of ``scorers.SCORERS``;
``exact`` when an answer is given without one), ``id`` and ``lang``; other keys are ignored.
A bad line is reported with its number and skipped; the run goes on with the rest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvserve.errors import ConfigError
from kvserve.evaluate.scorers import SCORERS
from kvserve.evaluate.tasks import Task, user_message

_ROLES = ("system", "user", "assistant", "tool", "developer")


def load_task_file(
    path: Path, prompt_endpoint: str = "completions"
) -> tuple[list[Task], list[str]]:
    """(tasks, problems): each problem is ``"file:line: why"``. ``prompt_endpoint``: "chat"
    sends a ``prompt`` row as one user message to the chat endpoint."""
    if not path.is_file():
        raise ConfigError(f"--tasks: no such file {str(path)!r}")
    tasks: list[Task] = []
    problems: list[str] = []
    seen: set[str] = set()
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                task = _task_from_line(line, lineno, prompt_endpoint)
                if task.id in seen:
                    raise ValueError(f"duplicate id {task.id!r}")
            except ValueError as exc:
                problems.append(f"{path}:{lineno}: {exc}")
                continue
            seen.add(task.id)
            tasks.append(task)
    return tasks, problems


def _task_from_line(line: str, lineno: int, prompt_endpoint: str) -> Task:
    try:
        row = json.loads(line)
    except ValueError:
        raise ValueError(f"not JSON: {line.strip()[:60]!r}") from None
    if not isinstance(row, dict):
        raise ValueError("expected a JSON object")
    kind = row.get("type")
    if not isinstance(kind, str) or not kind.strip():
        raise ValueError("'type' is missing or not a non-empty string")
    prompt, messages = _prompt_or_messages(row)
    if prompt is not None and prompt_endpoint == "chat":
        prompt, messages = None, user_message(prompt)
    answer, scorer = row.get("answer"), row.get("scorer")
    if scorer is not None and scorer not in SCORERS:
        raise ValueError(f"unknown scorer {scorer!r} (known: {', '.join(SCORERS)})")
    if scorer is not None and answer is None:
        raise ValueError(f"scorer {scorer!r} needs an 'answer'")
    if answer is not None:
        scorer = scorer or "exact"
        SCORERS[scorer].check(answer)
    return Task(id=str(row.get("id", f"line{lineno}")), type=kind.strip(), prompt=prompt,
                messages=messages, answer=answer, scorer=scorer, lang=row.get("lang"))  # fmt: skip


def _prompt_or_messages(row: dict[str, Any]) -> tuple[str | None, list[dict] | None]:
    prompt, messages = row.get("prompt"), row.get("messages")
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of 'prompt' and 'messages'")
    if prompt is not None:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("'prompt' must be a non-empty string")
        return prompt, None
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise ValueError(f"messages[{i}] needs a 'role' of {', '.join(_ROLES)}")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{i}] needs a string 'content'")
    return None, messages
