"""The output cache on the in-process engine target (the session's bundled model): an
interrupted run resumes with only the missing tasks; a second target does not touch the
first one's cache."""

from __future__ import annotations

from pathlib import Path

from kvserve.evaluate.builtin import builtin_tasks
from kvserve.evaluate.collect import RunSettings, collect_target
from kvserve.evaluate.targets.engine import EngineTarget


def test_interrupted_run_resumes(bundled_llm, tmp_path: Path) -> None:  # noqa: ANN001
    tasks = builtin_tasks(1, seed=3, langs=("en",), types=("arithmetic", "table_lookup",
                                                             "reading_choice"))  # fmt: skip
    run = RunSettings(max_tokens=4, concurrency=2, cache_dir=tmp_path, quiet=True)
    target = EngineTarget("base", settings={"device": "cpu"}, llm=bundled_llm)
    first, stats = collect_target(target, tasks, run)
    assert stats["sent"] == 3 and stats["from_cache"] == 0
    assert all(c.ok and c.completion_tokens >= 1 for c in first.values())

    # interrupted: the last line was cut short mid-write, and one task never finished
    cache = Path(stats["cache_file"])
    lines = cache.read_text().splitlines()
    cache.write_text(lines[0] + "\n" + lines[1][:25])
    again, stats = collect_target(target, tasks, run)
    assert (stats["from_cache"], stats["sent"]) == (1, 2)
    assert set(again) == {t.id for t in tasks}
    assert again[tasks[0].id] == first[tasks[0].id]

    # the same engine under another name and settings keeps its own cache
    other = EngineTarget("cand", settings={"device": "cpu", "x": 1}, llm=bundled_llm)
    _, stats = collect_target(other, tasks[:1], run)
    assert stats["sent"] == 1 and Path(stats["cache_file"]) != cache
    _, stats = collect_target(target, tasks, run)
    assert (stats["from_cache"], stats["sent"]) == (3, 0)
