"""Fixed-size KV pages with reference counts. A page is free (ref 0, not cached), in use
(ref > 0: held by that many requests) or cached-and-evictable (ref 0, owned by the radix cache).
The pool only counts; the radix cache decides what is cached."""

from __future__ import annotations

from collections import deque


class BlockPool:
    def __init__(self, num_pages: int) -> None:
        if num_pages <= 0:
            raise ValueError(f"the KV cache needs at least one page, got {num_pages}")
        self.num_pages = num_pages
        self.ref_counts = [0] * num_pages
        self._free: deque[int] = deque(range(num_pages))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def free_pages(self) -> list[int]:
        return list(self._free)

    def take(self, n: int) -> list[int]:
        """Take ``n`` free pages (caller checked ``num_free``); each starts with ref 1."""
        pages = [self._free.popleft() for _ in range(n)]
        for p in pages:
            self.ref_counts[p] = 1
        return pages

    def incref(self, page: int) -> int:
        self.ref_counts[page] += 1
        return self.ref_counts[page]

    def decref(self, page: int) -> int:
        count = self.ref_counts[page] - 1
        if count < 0:
            raise RuntimeError(f"page {page} released more often than acquired")
        self.ref_counts[page] = count
        return count

    def give_back(self, page: int) -> None:
        """Return an unreferenced, uncached page to the free list."""
        self._free.append(page)
