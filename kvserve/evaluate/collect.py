"""Get every target's output for every task: from the cache where it is there, else by
asking the target (with a progress bar), caching each output as it arrives."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from kvserve.evaluate.cache import OutputCache
from kvserve.evaluate.completion import Completion
from kvserve.evaluate.progress import ProgressBar
from kvserve.evaluate.targets import Target
from kvserve.evaluate.targets.engine import EngineTarget
from kvserve.evaluate.tasks import Task


@dataclass(frozen=True)
class RunSettings:
    max_tokens: int = 256
    concurrency: int = 16
    cache_dir: Path = Path("runs/eval/cache")
    fresh: bool = False  # ignore (and drop) cached outputs
    quiet: bool = False


def collect_target(target: Target, tasks: list[Task], run: RunSettings
                   ) -> tuple[dict[str, Completion], dict]:  # fmt: skip
    """(task id -> completion, stats of what was sent)."""
    cache = OutputCache(run.cache_dir, target.name, target.identity)
    if run.fresh:
        cache.clear()
    got: dict[str, Completion] = {}
    for t in tasks:
        hit = cache.get(t.key(run.max_tokens))
        if hit is not None:
            got[t.id] = hit
    pending = [t for t in tasks if t.id not in got]
    stats = {"identity": target.identity, "cache_file": str(cache.path),
             "from_cache": len(got), "sent": len(pending), "failed": 0, "seconds": 0.0,
             "completion_tokens": 0}  # fmt: skip
    if not pending:
        return got, stats
    bar = ProgressBar(target.name, len(pending), run.quiet)

    def sink(task: Task, completion: Completion) -> None:
        cache.put(task.key(run.max_tokens), completion)
        got[task.id] = completion
        stats["failed"] += 0 if completion.ok else 1
        stats["completion_tokens"] += completion.completion_tokens
        bar.update(completion)

    start = time.perf_counter()
    try:
        target.run(pending, run.max_tokens, run.concurrency, sink)
    finally:
        stats["seconds"] = round(time.perf_counter() - start, 3)
        if isinstance(target, EngineTarget):  # its seconds include building the engine
            stats["load_seconds"] = target.load_seconds
        bar.close()
    return got, stats
