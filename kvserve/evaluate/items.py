"""Per-item comparison: each task with every target's output, task score, and each
candidate's ROUGE-L and exact agreement against the baseline (one row of outputs.jsonl)."""

from __future__ import annotations

from typing import Any

from kvserve.evaluate.completion import Completion
from kvserve.evaluate.rouge import rouge_l
from kvserve.evaluate.scorers import score
from kvserve.evaluate.tasks import Task


def item_row(
    task: Task, outputs: dict[str, Completion], baseline: str, candidates: list[str]
) -> dict[str, Any]:
    """``outputs``: target name -> its completion (baseline first). A failed request is an
    empty reply: it scores 0 and agrees with nothing."""
    texts = {name: c.text for name, c in outputs.items()}
    base = texts[baseline]
    return {
        "id": task.id,
        "type": task.type,
        "lang": task.lang,
        "scorer": task.scorer,
        "answer": task.answer,
        "endpoint": task.endpoint,
        "request": task.request(),
        "outputs": texts,
        "finish_reasons": {n: c.finish_reason for n, c in outputs.items()},
        "errors": {n: c.error for n, c in outputs.items() if c.error},
        "scores": {
            n: None if task.scorer is None else score(task.scorer, t, task.answer)
            for n, t in texts.items()
        },
        "rouge_l": {n: rouge_l(base, texts[n]) for n in candidates},
        "agree": {n: texts[n].strip() == base.strip() for n in candidates},
    }
