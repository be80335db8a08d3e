"""The KV cache manager: a small check-then-act API over the page pool and the radix cache.

    match_prefix -> acquire (lock) -> allocate -> cache (insert) -> release (free) / evict

``check_integrity()`` verifies free + evictable + in-use == total and that every reference is
held by a live request; tests run it after every engine test and the engine runs it when idle.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from kvserve.engine.core.block_pool import BlockPool
from kvserve.engine.core.radix_cache import RadixCache, RadixNode


class KVCacheIntegrityError(AssertionError):
    pass


class KVCacheManager:
    def __init__(self, num_pages: int, page_size: int, enable_prefix_cache: bool) -> None:
        self.page_size = page_size
        self.enable_prefix_cache = enable_prefix_cache
        self.pool = BlockPool(num_pages)
        self.cache = RadixCache(self.pool, page_size)
        # Evict at least this many pages at a time: each eviction sorts the evictable leaves,
        # so one per page would cost that sort on every allocation once the cache is full.
        self.evict_batch = max(1, num_pages // 128)

    @property
    def num_pages(self) -> int:
        return self.pool.num_pages

    @property
    def num_free_pages(self) -> int:
        return self.pool.num_free

    @property
    def num_available_pages(self) -> int:
        """Pages an allocation could get now: free ones plus evictable cached ones."""
        return self.pool.num_free + self.cache.num_evictable

    @property
    def usage(self) -> float:
        """Share of pages held by requests (cached-but-idle pages count as free)."""
        return 1.0 - self.num_available_pages / self.num_pages

    def match_prefix(self, tokens: list[int]) -> list[int]:
        return self.cache.match(tokens) if self.enable_prefix_cache else []

    def acquire(self, pages: Iterable[int]) -> None:
        for p in pages:
            self.cache.acquire(p)

    def release(self, pages: Iterable[int]) -> None:
        for p in pages:
            self.cache.release(p)

    def allocate(self, n: int) -> list[int] | None:
        """``n`` fresh pages (ref 1 each), evicting cached pages if needed; None if impossible."""
        if n > self.num_available_pages:
            return None
        if n > self.pool.num_free:
            self.cache.evict(max(n - self.pool.num_free, self.evict_batch))
        return self.pool.take(n)

    def cache_pages(
        self, tokens: list[int], pages: list[int], start: int = 0, parent: RadixNode | None = None
    ) -> tuple[list[int], RadixNode | None]:
        """Insert full pages ``start..`` (``tokens`` begins at page ``start``) below ``parent``
        (the node of page ``start - 1``); returns the canonical pages and the last page's node
        (RadixCache.insert)."""
        if not self.enable_prefix_cache:
            return pages, None
        return self.cache.insert(tokens, pages, start, parent)

    def reset_prefix_cache(self) -> int:
        return self.cache.evict(self.cache.num_evictable)

    def check_integrity(self, live_block_tables: Iterable[list[int]]) -> None:
        holders = Counter(p for table in live_block_tables for p in table)
        refs = self.pool.ref_counts
        free = self.pool.free_pages()
        if len(set(free)) != len(free):
            raise KVCacheIntegrityError("a page is on the free list twice")
        cached = self.cache.page_to_node
        in_use = sum(1 for r in refs if r > 0)
        evictable = sum(1 for p in cached if refs[p] == 0)
        if len(free) + evictable + in_use != self.num_pages:
            raise KVCacheIntegrityError(
                f"free {len(free)} + evictable {evictable} + in use {in_use} "
                f"!= total {self.num_pages}"
            )
        if evictable != self.cache.num_evictable:
            raise KVCacheIntegrityError(
                f"evictable counter {self.cache.num_evictable} != actual {evictable}"
            )
        if self.cache.evictable_leaves != self.cache.evictable_leaves_by_walk():
            raise KVCacheIntegrityError("the evictable-leaf set differs from the tree")
        for p in free:
            if refs[p] or p in cached:
                raise KVCacheIntegrityError(f"free page {p} is referenced or cached")
        for p, r in enumerate(refs):
            if r != holders.get(p, 0):
                raise KVCacheIntegrityError(
                    f"page {p} has {r} references but {holders.get(p, 0)} live holders"
                )
