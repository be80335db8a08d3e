"""Read one value out of a markdown table (scorer ``exact``)."""

from __future__ import annotations

import random

from kvserve.evaluate.builtin.vocab import CITIES, JOBS, NAMES, pick

TYPE, SCORER = "table_lookup", "exact"
_HEADERS = {"en": ("Name", "City", "Job", "Age"), "zh": ("姓名", "城市", "职业", "年龄")}


def make(rng: random.Random, lang: str) -> tuple[str, str]:
    n = rng.randint(3, 5)
    names, cities = pick(rng, NAMES, lang, n), pick(rng, CITIES, lang, n)
    rows = [(names[i], cities[i], rng.choice(JOBS[lang]), str(rng.randint(21, 65)))
            for i in range(n)]  # fmt: skip
    head = _HEADERS[lang]
    table = "\n".join(
        ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        + ["| " + " | ".join(r) + " |" for r in rows]
    )
    row, col = rng.randrange(n), rng.randint(1, 3)
    who, what = rows[row][0], head[col]
    if lang == "zh":
        text = f"下面是一张表格：\n\n{table}\n\n{who}的{what}是什么？只回答表格里的值。"
    else:
        text = (f"Here is a table:\n\n{table}\n\nWhat is the {what.lower()} of {who}? "
                "Reply with the value only.")  # fmt: skip
    return text, rows[row][col]
