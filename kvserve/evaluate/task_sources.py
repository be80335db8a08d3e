"""``--tasks`` sources: ``builtin`` (the generated sets) or a JSONL file of your own."""

from __future__ import annotations

import sys
from pathlib import Path

from kvserve.errors import ConfigError
from kvserve.evaluate.builtin import builtin_tasks
from kvserve.evaluate.task_file import load_task_file
from kvserve.evaluate.tasks import Task


def gather_tasks(sources: list[str], per_type: int, seed: int, langs: tuple[str, ...],
                 types: tuple[str, ...] | None, prompt_endpoint: str
                 ) -> tuple[list[Task], list[str]]:  # fmt: skip
    """(tasks, bad rows); bad rows are printed to stderr here, one line each."""
    tasks: list[Task] = []
    problems: list[str] = []
    for source in sources:
        if source == "builtin":
            tasks += builtin_tasks(per_type, seed, langs, types)
            continue
        loaded, bad = load_task_file(Path(source), prompt_endpoint)
        tasks += loaded
        problems += bad
    ids = [t.id for t in tasks]
    dup = next((i for i in ids if ids.count(i) > 1), None) if len(set(ids)) < len(ids) else None
    if dup is not None:
        raise ConfigError(f"task id {dup!r} appears in more than one --tasks source")
    for p in problems:
        print(f"kvserve eval: skipped bad row: {p}", file=sys.stderr)
    if not tasks:
        raise ConfigError("no tasks to run" + (f" ({len(problems)} bad rows)" if problems else ""))
    return tasks, problems
