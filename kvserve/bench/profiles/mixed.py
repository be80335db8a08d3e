"""`mixed`: the field's production-like mix. By request share: 45% multi-turn chat turns, 30%
single-turn QA, 25% long-document QA; one system prompt shared by all, sized so it is about
``system_share`` of all input tokens."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from kvserve.bench.corpus import TokenPool
from kvserve.bench.profiles.base import Turn, Unit, tag
from kvserve.errors import ConfigError

SHARES = {"chat": 0.45, "qa": 0.30, "doc": 0.25}


@dataclass(frozen=True)
class MixedLengths:
    chat_turns: int = 4
    chat_user_len: int = 64
    chat_output_len: int = 128
    qa_len: int = 128
    qa_output_len: int = 128
    doc_len: int = 2048
    doc_question_len: int = 64
    doc_output_len: int = 128

    def mean_non_system(self) -> float:
        """Mean input tokens per request beyond the system prompt (chat turn k carries k user
        messages and k-1 answers)."""
        t = self.chat_turns
        chat = sum(k * self.chat_user_len + (k - 1) * self.chat_output_len for k in range(1, t + 1))
        return (
            SHARES["chat"] * chat / t
            + SHARES["qa"] * self.qa_len
            + SHARES["doc"] * (self.doc_len + self.doc_question_len)
        )


def system_len(lengths: MixedLengths, share: float) -> int:
    if not 0 <= share < 1:
        raise ConfigError(f"--system-share must be in [0, 1), got {share}")
    return round(share * lengths.mean_non_system() / (1 - share))


def _pick_class(rng: random.Random, turns: int) -> str:
    # unit weights so that *requests* follow SHARES: a chat unit brings `turns` requests
    weights = {"chat": SHARES["chat"] / turns, "qa": SHARES["qa"], "doc": SHARES["doc"]}
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def units(
    pool: TokenPool, rng: random.Random, lengths: MixedLengths, system_share: float = 0.7
) -> Iterator[Unit]:
    system = pool.tagged(tag(rng, "system"), rng, system_len(lengths, system_share))[0]
    index = 0
    while True:
        cls = _pick_class(rng, lengths.chat_turns)
        label = f"{cls} {index}"
        if cls == "chat":
            turns = [
                Turn(pool.tagged(tag(rng, f"{label}.{k}"), rng, lengths.chat_user_len)[0],
                     lengths.chat_output_len)
                for k in range(lengths.chat_turns)
            ]  # fmt: skip
            yield Unit("chat", turns, system=system, session=True)
        elif cls == "qa":
            question = pool.tagged(tag(rng, label), rng, lengths.qa_len)[0]
            yield Unit("qa", [Turn(question, lengths.qa_output_len)], system=system)
        else:
            doc = pool.tagged(tag(rng, label), rng, lengths.doc_len)[0]
            question = pool.text(rng, lengths.doc_question_len)
            user = f"{doc}\n\nQuestion about the document above: {question}"
            yield Unit("doc", [Turn(user, lengths.doc_output_len)], system=system)
        index += 1
