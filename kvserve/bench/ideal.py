"""Ideal prefix-cache hit rate of a workload, from the token sequences actually sent.

Definition: for each prompt in send order, the ideal cached tokens are the length of the longest
common prefix (in token ids, any length, no page rounding) between it and any earlier sent prompt,
capped at ``len(prompt) - 1`` because a server must compute at least one prompt token to produce
logits. This is what an unbounded, never-evicting prefix cache (a trie over token ids holding every
earlier prompt) could have served. Generated tokens are not inserted: a server that also caches
decoded tokens can beat it on multi-turn chat, by at most the answers' share.

Instead of a trie we keep earlier prompts sorted as byte strings: the longest common prefix of a
string with a set is attained at its lexicographic neighbours, so two comparisons per prompt give
the trie's answer with memory of one int32 per token and no per-token Python loop.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np


def _common_prefix(a: bytes, b: bytes) -> int:
    """Common prefix length of two big-endian int32 strings, in tokens."""
    n = min(len(a), len(b)) // 4
    if n == 0:
        return 0
    x = np.frombuffer(a, dtype=">i4", count=n)
    y = np.frombuffer(b, dtype=">i4", count=n)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


class PrefixTracker:
    """Feeds prompts in send order; returns each one's ideal cached tokens."""

    def __init__(self) -> None:
        self._sorted: list[bytes] = []
        self.prompt_tokens = 0
        self.ideal_tokens = 0

    def observe(self, ids: Sequence[int]) -> int:
        key = np.asarray(ids, dtype=">i4").tobytes()
        pos = bisect.bisect_left(self._sorted, key)
        best = 0
        for j in (pos - 1, pos):
            if 0 <= j < len(self._sorted):
                best = max(best, _common_prefix(key, self._sorted[j]))
        if pos == len(self._sorted) or self._sorted[pos] != key:
            self._sorted.insert(pos, key)
        hit = min(best, max(len(ids) - 1, 0))
        self.prompt_tokens += len(ids)
        self.ideal_tokens += hit
        return hit

    @property
    def hit_rate(self) -> float:
        return self.ideal_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def ideal_hit_rate(prompts: Sequence[Sequence[int]]) -> float:
    tracker = PrefixTracker()
    for ids in prompts:
        tracker.observe(ids)
    return tracker.hit_rate
