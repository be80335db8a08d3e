"""Free-form rewrites of one sentence: no answer, ROUGE-L to the baseline."""

from __future__ import annotations

import random

from kvserve.evaluate.builtin.vocab import CITIES, NAMES, pick

TYPE, SCORER = "rewrite", None


def make(rng: random.Random, lang: str) -> tuple[str, None]:
    name, city = pick(rng, NAMES, lang)[0], pick(rng, CITIES, lang)[0]
    days = rng.randint(2, 9)
    if lang == "zh":
        sentence = f"{name}下周要去{city}看朋友，打算在那里待{days}天。"
        style = rng.choice(["更正式", "更简短", "更礼貌"])
        return f"把下面这句话改写得{style}：{sentence}", None
    sentence = f"{name} is going to {city} next week to see some friends and will stay {days} days."
    style = rng.choice(["more formal", "shorter", "more polite"])
    return f"Rewrite the following sentence to be {style}: {sentence}", None
