"""Cache-aware routing (sglang-router style): send a request where its prefix was sent before,
unless the load is out of balance.

- Imbalanced (max - min outstanding > `balance_abs_threshold` and max > `balance_rel_threshold`
  x min): the least loaded worker.
- Else the worker whose prefix tree matches the longest prefix, if the match covers more than
  `cache_threshold` of the key; on a miss, the worker with the smallest tree (most cache room).
The chosen worker's tree then records the key. Trees are trimmed to `max_tree_size` by
`evict`, which the router calls every `eviction_interval_s`."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from kvserve.router.config import CacheAwareConfig
from kvserve.router.policies.base import RouteRequest
from kvserve.router.policies.prefix_tree import PrefixTree
from kvserve.router.worker import Worker


class CacheAwarePolicy:
    name = "cache_aware"
    needs_key = True

    def __init__(self, config: CacheAwareConfig) -> None:
        self.config = config
        self.trees: dict[str, PrefixTree] = {}

    def _tree(self, url: str) -> PrefixTree:
        tree = self.trees.get(url)
        if tree is None:
            tree = self.trees[url] = PrefixTree()
        return tree

    def _imbalanced(self, workers: Sequence[Worker]) -> bool:
        loads = [w.outstanding for w in workers]
        hi, lo = max(loads), min(loads)
        cfg = self.config
        return hi - lo > cfg.balance_abs_threshold and hi > cfg.balance_rel_threshold * lo

    def select(self, workers: Sequence[Worker], request: RouteRequest) -> Worker:
        key, now = request.key, time.monotonic()
        if len(workers) == 1:
            chosen = workers[0]
        elif not key or self._imbalanced(workers):
            chosen = min(workers, key=lambda w: w.outstanding)
        else:
            chosen = self._by_prefix(workers, key, now)
        if key:
            self._tree(chosen.url).insert(key, now)
        return chosen

    def _by_prefix(self, workers: Sequence[Worker], key: Sequence[object], now: float) -> Worker:
        best, best_len = workers[0], -1
        for w in workers:
            n = self._tree(w.url).match_len(key, now)
            if n > best_len or (n == best_len and w.outstanding < best.outstanding):
                best, best_len = w, n
        if best_len / len(key) > self.config.cache_threshold:
            return best
        return min(workers, key=lambda w: (self._tree(w.url).size, w.outstanding))

    def evict(self, live_urls: Iterable[str]) -> None:
        """Trims every tree to the budget and forgets trees of workers no longer listed."""
        live = set(live_urls)
        for url in list(self.trees):
            if url not in live:
                del self.trees[url]
            else:
                self.trees[url].evict(self.config.max_tree_size)
