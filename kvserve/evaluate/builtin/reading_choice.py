"""Multiple choice over a given passage (scorer ``choice``)."""

from __future__ import annotations

import random

from kvserve.evaluate.builtin.person import Person, person
from kvserve.evaluate.builtin.vocab import CITIES, DRINKS, JOBS

TYPE, SCORER = "reading_choice", "choice"
_LETTERS = "ABCD"


def _question(p: Person, rng: random.Random) -> tuple[str, str, list[str]]:
    """(question, right option, the list it was drawn from)."""
    zh = p.lang == "zh"
    return rng.choice([
        (f"{p.name}住在哪个城市？" if zh else f"Which city does {p.name} live in?",
         p.city, CITIES[p.lang]),
        (f"{p.name}的职业是什么？" if zh else f"What is {p.name}'s job?",
         p.job, JOBS[p.lang]),
        (f"{p.name}每天早上喝什么？" if zh else f"What does {p.name} drink every morning?",
         p.drink, DRINKS[p.lang]),
    ])  # fmt: skip


def make(rng: random.Random, lang: str) -> tuple[str, str]:
    p = person(rng, lang)
    question, right, pool = _question(p, rng)
    options = [right, *rng.sample([x for x in pool if x != right], 3)]
    rng.shuffle(options)
    listed = "\n".join(f"{_LETTERS[i]}. {o}" for i, o in enumerate(options))
    if lang == "zh":
        text = (f"请阅读短文并回答问题。\n\n短文：{p.passage()}\n\n问题：{question}\n{listed}\n\n"
                "只回答正确选项的字母。")  # fmt: skip
    else:
        text = (f"Read the passage and answer the question.\n\nPassage: {p.passage()}\n\n"
                f"Question: {question}\n{listed}\n\n"
                "Answer with the letter of the correct option.")  # fmt: skip
    return text, _LETTERS[options.index(right)]
