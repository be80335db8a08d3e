"""`shared-prefix`: G groups x P prefix tokens x Q questions per group, groups interleaved so the
cache must hold all G prefixes at once. Ideal hit rate ~ G*(Q-1)*P / total prompt tokens."""

from __future__ import annotations

import random
from collections.abc import Iterator

from kvserve.bench.corpus import TokenPool
from kvserve.bench.profiles.base import Turn, Unit, tag


def units(
    pool: TokenPool, rng: random.Random, groups: int, prefix_len: int, questions: int,
    question_len: int, output_len: int,
) -> Iterator[Unit]:  # fmt: skip
    prefixes = [pool.tagged(tag(rng, f"document {g}"), rng, prefix_len)[0] for g in range(groups)]
    order = [(q, g) for q in range(questions) for g in range(groups)]
    round_ = 0
    while True:  # after G*Q requests, more questions on the same prefixes
        for q, g in order:
            label = f"question {round_ * questions + q} on document {g}"
            question = pool.tagged(tag(rng, label), rng, question_len)[0]
            yield Unit(f"group{g}", [Turn(question, output_len)], system=prefixes[g])
        round_ += 1
