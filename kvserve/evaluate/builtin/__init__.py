"""Built-in task sets: generated from a seed (the same seed gives the same tasks on every
machine), English and Chinese, sent to the chat endpoint (they are instructions for a chat
model, so each is one user message under the server's chat template)."""

from __future__ import annotations

import random
from types import ModuleType

from kvserve.errors import ConfigError
from kvserve.evaluate.builtin import (
    arithmetic,
    extraction,
    instruction,
    reading_choice,
    rewrite,
    summary,
    table_lookup,
)
from kvserve.evaluate.tasks import Task, user_message

GENERATORS: dict[str, ModuleType] = {
    m.TYPE: m
    for m in (arithmetic, table_lookup, extraction, reading_choice, instruction, summary, rewrite)
}
LANGS = ("en", "zh")


def builtin_tasks(per_type: int, seed: int = 0, langs: tuple[str, ...] = LANGS,
                  types: tuple[str, ...] | None = None) -> list[Task]:  # fmt: skip
    """``per_type`` tasks of each type, languages taking turns (en, zh, en, ...)."""
    unknown = set(langs) - set(LANGS) or set(types or ()) - set(GENERATORS)
    if unknown:
        raise ConfigError(f"unknown built-in language or type: {', '.join(sorted(unknown))}")
    if per_type < 1:
        raise ConfigError(f"--per-type must be at least 1, got {per_type}")
    tasks = []
    for kind in types or tuple(GENERATORS):
        gen = GENERATORS[kind]
        for i in range(per_type):
            lang = langs[i % len(langs)]
            # A string seed goes through SHA-512 in `random`: stable across runs and machines.
            rng = random.Random(f"{seed}:{kind}:{lang}:{i}")
            text, answer = gen.make(rng, lang)
            tasks.append(Task(id=f"{kind}-{lang}-{i}", type=kind, messages=user_message(text),
                              answer=answer, scorer=gen.SCORER, lang=lang))  # fmt: skip
    return tasks
