"""Radix prefix cache over page-aligned token ids.

Each node holds one full page: its key is the page's token ids, its value the KV page id, and
its path from the root spells the whole prefix. A page in the tree is locked while any request
holds it (its pool ref count > 0) and evictable once none does. Invariant: a locked node's
ancestors are locked too (a request holds its whole prefix), so ref-0 nodes form subtrees at the
bottom and can all be reclaimed by evicting least-recently-used leaves.

The evictable leaves (no children, ref 0) are kept as a set, updated as references and children
change, so an eviction looks at those leaves only and never walks the tree: with a full cache
every new page comes from an eviction, and a walk of tens of thousands of nodes per page stalled
the engine for a third of a second per step.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvserve.engine.core.block_pool import BlockPool


@dataclass(eq=False)
class RadixNode:
    key: tuple[int, ...]
    page: int
    parent: RadixNode | None
    children: dict[tuple[int, ...], RadixNode] = field(default_factory=dict)
    last_access: float = 0.0


class RadixCache:
    def __init__(self, pool: BlockPool, page_size: int) -> None:
        self.pool = pool
        self.page_size = page_size
        self.root = RadixNode(key=(), page=-1, parent=None)
        self.page_to_node: dict[int, RadixNode] = {}
        self.num_evictable = 0  # cached pages with ref 0
        self.evictable_leaves: set[RadixNode] = set()  # cached, ref 0 and no children
        self._clock: Callable[[], float] = time.monotonic

    def match(self, tokens: list[int]) -> list[int]:
        """Pages of the longest cached page-aligned prefix of ``tokens`` (not locked)."""
        node, pages, now, ps = self.root, [], self._clock(), self.page_size
        for i in range(len(tokens) // ps):
            child = node.children.get(tuple(tokens[i * ps : (i + 1) * ps]))
            if child is None:
                break
            child.last_access = now
            pages.append(child.page)
            node = child
        return pages

    def insert(
        self,
        tokens: list[int],
        pages: list[int],
        start: int = 0,
        parent: RadixNode | None = None,
    ) -> tuple[list[int], RadixNode]:
        """Cache full pages ``start, start + 1, ...`` whose token ids are ``tokens`` (page
        ``start`` begins at ``tokens[0]``; ``pages[i]`` holds page i, held by the caller) below
        ``parent``, the node of page ``start - 1`` (the root when ``start`` is 0). Returns the
        canonical page list and the node of the last full page: where the tree already held a
        page with the same prefix, that page replaces the caller's, with the ref counts moved
        accordingly."""
        node, out, now = parent or self.root, list(pages), self._clock()
        ps = self.page_size
        for j in range(len(tokens) // ps):
            i = start + j
            key = tuple(tokens[j * ps : (j + 1) * ps])
            child = node.children.get(key)
            if child is None:
                child = RadixNode(key=key, page=pages[i], parent=node, last_access=now)
                node.children[key] = child
                self.evictable_leaves.discard(node)  # has a child now
                self.page_to_node[pages[i]] = child
            elif child.page != pages[i]:
                self.acquire(child.page)
                self.release(pages[i])
                out[i] = child.page
            child.last_access = now
            node = child
        return out, node

    def acquire(self, page: int) -> None:
        if self.pool.incref(page) == 1:
            node = self.page_to_node.get(page)
            if node is not None:
                self.num_evictable -= 1
                self.evictable_leaves.discard(node)

    def release(self, page: int) -> None:
        """Drop one reference; an unreferenced page goes to the free list unless cached."""
        if self.pool.decref(page) == 0:
            node = self.page_to_node.get(page)
            if node is None:
                self.pool.give_back(page)
                return
            self.num_evictable += 1
            if not node.children:
                self.evictable_leaves.add(node)

    def evict(self, num_pages: int) -> int:
        """Free up to ``num_pages`` unreferenced cached pages, least recently used leaves first."""
        tie = itertools.count()
        heap = [(n.last_access, next(tie), n) for n in self.evictable_leaves]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < num_pages:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            del parent.children[node.key]
            del self.page_to_node[node.page]
            self.evictable_leaves.remove(node)
            self.pool.give_back(node.page)
            self.num_evictable -= 1
            freed += 1
            if parent is not self.root and not parent.children and self._unreferenced(parent):
                self.evictable_leaves.add(parent)
                heapq.heappush(heap, (parent.last_access, next(tie), parent))
        return freed

    def _unreferenced(self, node: RadixNode) -> bool:
        return self.pool.ref_counts[node.page] == 0

    def evictable_leaves_by_walk(self) -> set[RadixNode]:
        """The evictable leaves found by walking the whole tree (integrity checks only)."""
        found, stack = set(), list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif self._unreferenced(node):
                found.add(node)
        return found
