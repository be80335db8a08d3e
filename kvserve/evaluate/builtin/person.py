"""A short made-up profile of one person: the passage behind ``reading_choice`` and
``summary``, with each fact kept apart so a question can be asked about it."""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvserve.evaluate.builtin.vocab import CITIES, DRINKS, JOBS, NAMES, PETS, pick


@dataclass(frozen=True)
class Person:
    lang: str
    name: str
    city: str
    job: str
    pets: str
    count: int
    drink: str

    def passage(self) -> str:
        if self.lang == "zh":
            return (f"{self.name}住在{self.city}，是一名{self.job}。{self.name}养了{self.count}只"
                    f"{self.pets}。每天早上，{self.name}都会喝{self.drink}，然后走路去上班。"
                    f"周末的时候，{self.name}喜欢和朋友们一起去公园散步。")  # fmt: skip
        n = self.name
        return (f"{n} lives in {self.city} and works as a {self.job}. {n} has {self.count} "
                f"{self.pets}. Every morning, {n} drinks {self.drink} and then walks to work. "
                f"On weekends, {n} likes to walk in the park with friends.")  # fmt: skip


def person(rng: random.Random, lang: str) -> Person:
    return Person(lang, pick(rng, NAMES, lang)[0], pick(rng, CITIES, lang)[0],
                  pick(rng, JOBS, lang)[0], pick(rng, PETS, lang)[0], rng.randint(2, 5),
                  pick(rng, DRINKS, lang)[0])  # fmt: skip
