"""Free-form one-sentence summaries of a short passage: no answer, ROUGE-L to the baseline."""

from __future__ import annotations

import random

from kvserve.evaluate.builtin.person import person

TYPE, SCORER = "summary", None


def make(rng: random.Random, lang: str) -> tuple[str, None]:
    passage = person(rng, lang).passage()
    if lang == "zh":
        return f"用一句话概括下面这段文字。\n\n{passage}", None
    return f"Summarize the following text in one sentence.\n\n{passage}", None
