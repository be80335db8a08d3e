"""Real English text for prompts, made locally: public-domain passages interleaved with varied
sentences drawn from shipped word lists; and a pool of its token ids to cut prompts from."""

from __future__ import annotations

import json
import random
from functools import lru_cache
from importlib import resources

import numpy as np

from kvserve.bench.tokens import Tokenizer

POOL_CHARS = 600_000  # ~130K tokens: far more than any prompt slice needs to look varied


@lru_cache(maxsize=1)
def _words() -> dict[str, list[str]]:
    return json.loads(resources.files("kvserve.bench").joinpath("data/words.json").read_text())


@lru_cache(maxsize=1)
def _passages() -> list[str]:
    text = resources.files("kvserve.bench").joinpath("data/passages.txt").read_text()
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def sentence(rng: random.Random) -> str:
    w = _words()
    pick = {k: rng.choice(v) for k, v in w.items() if k != "templates"}
    names = w["names"]
    fill = {
        "time": pick["times"], "name": pick["names"], "name2": rng.choice(names),
        "verb": pick["verbs"], "intr": pick["intransitive"], "adj": pick["adjectives"],
        "noun": pick["nouns"], "noun2": rng.choice(w["nouns"]), "place": pick["places"],
        "abstract": pick["abstract"], "conn": pick["connectives"], "adv": pick["adverbs"],
    }  # fmt: skip
    text = rng.choice(w["templates"]).format(**fill)
    return text[0].upper() + text[1:]


def text(rng: random.Random, n_chars: int) -> str:
    """Paragraphs of about ``n_chars`` characters; one in eight is a literary passage."""
    paragraphs: list[str] = []
    size = 0
    while size < n_chars:
        if rng.random() < 0.125:
            para = rng.choice(_passages())
        else:
            para = " ".join(sentence(rng) for _ in range(rng.randint(3, 7)))
        paragraphs.append(para)
        size += len(para) + 2
    return "\n\n".join(paragraphs)


class TokenPool:
    """Token ids of a long corpus text; prompts are slices of it at random offsets."""

    def __init__(self, tokenizer: Tokenizer, seed: int = 0, n_chars: int = POOL_CHARS) -> None:
        self.tokenizer = tokenizer
        self.ids = np.asarray(tokenizer.encode(text(random.Random(seed), n_chars)), dtype=np.int64)

    def take(self, rng: random.Random, n: int) -> list[int]:
        if n <= 0:
            return []
        start = rng.randrange(len(self.ids))
        return self.ids[(start + np.arange(n)) % len(self.ids)].tolist()

    def text(self, rng: random.Random, n: int) -> str:
        return self.tokenizer.decode(self.take(rng, n))

    def tagged(self, tag: str, rng: random.Random, n: int) -> tuple[str, list[int]]:
        """Text of about ``n`` tokens starting with ``tag`` (a unique tag prevents accidental
        prefix sharing) and its token ids."""
        head = self.tokenizer.encode(tag)
        ids = head + self.take(rng, max(n - len(head), 0))
        return self.tokenizer.decode(ids), ids
