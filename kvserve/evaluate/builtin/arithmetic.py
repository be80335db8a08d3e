"""Arithmetic word problems with one integer answer (scorer ``number``)."""

from __future__ import annotations

import random

from kvserve.evaluate.builtin.vocab import ITEMS, NAMES, pick

TYPE, SCORER = "arithmetic", "number"


def _problem(rng: random.Random, lang: str) -> tuple[str, int]:
    name, item = pick(rng, NAMES, lang)[0], pick(rng, ITEMS, lang)[0]
    a, b, c = rng.randint(5, 40), rng.randint(2, 9), rng.randint(1, 4)
    form = rng.randrange(4)
    if lang == "zh":
        text = [
            f"{name}有{a}个{item}，又买了{b}个，然后送给朋友{c}个。{name}现在有多少个{item}？",
            f"一个盒子装{b}个{item}。{a}个盒子一共装多少个{item}？",
            f"{name}每天读{b}页书，{a}天一共读多少页？",
            f"{name}有{a + b}元，午饭花了{b}元，又花了{c}元买水，还剩多少元？",
        ][form]
    else:
        text = [
            f"{name} has {a} {item}. {name} buys {b} more and then gives {c} to a friend. "
            f"How many {item} does {name} have now?",
            f"A box holds {b} {item}. How many {item} are in {a} boxes?",
            f"{name} reads {b} pages a day. How many pages does {name} read in {a} days?",
            f"{name} had {a + b} dollars, spent {b} dollars on lunch and {c} dollars on water. "
            "How many dollars are left?",
        ][form]
    answer = [a + b - c, a * b, a * b, a - c][form]
    return text, answer


def make(rng: random.Random, lang: str) -> tuple[str, int]:
    text, answer = _problem(rng, lang)
    suffix = "只用阿拉伯数字回答，不要解释。" if lang == "zh" else "Answer with the number only."
    return f"{text}\n{suffix}", answer
