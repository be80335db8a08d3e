"""An approximate radix tree of the prefixes the router sent to one worker (sglang-router's
cache-aware idea): it mirrors what the worker's prefix cache probably holds, not what it does
hold. Keys are strings (characters) or tuples of token ids; edges are compressed slices.
`evict` trims it to a size budget by dropping least-recently-used leaves."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from typing import Any


def common_prefix_len(a: Sequence[Any], b: Sequence[Any], start: int = 0) -> int:
    """Length of the common prefix of `a` and `b[start:]`, without copying `b`: the whole of
    `a` is checked first (the usual case on a long shared prefix), then a binary search that
    compares only the untested part each step, so a long prompt costs O(n) bytes compared in C,
    not O(n log n) copied."""
    hi = min(len(a), len(b) - start)
    if isinstance(b, str):
        same = b.startswith  # str: compares in place, from an offset
    else:

        def same(part: Sequence[Any], at: int) -> bool:
            return part == b[at : at + len(part)]

    if same(a if hi == len(a) else a[:hi], start):
        return hi
    lo = 0  # a[:lo] is known to match
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if same(a[lo:mid], start + lo):
            lo = mid
        else:
            hi = mid - 1
    return lo


class _Node:
    __slots__ = ("edge", "children", "parent", "last_access")

    def __init__(self, edge: Sequence[Any], parent: _Node | None, now: float) -> None:
        self.edge = edge
        self.children: dict[Any, _Node] = {}
        self.parent = parent
        self.last_access = now


class PrefixTree:
    def __init__(self) -> None:
        self.root = _Node((), None, 0.0)
        self.size = 0  # elements (characters or tokens) stored on all edges

    def match_len(self, key: Sequence[Any], now: float) -> int:
        """Length of the longest stored prefix of `key`; touches the nodes on the way."""
        node, i = self.root, 0
        while i < len(key):
            child = node.children.get(key[i])
            if child is None:
                break
            n = common_prefix_len(child.edge, key, i)
            child.last_access = now
            i += n
            if n < len(child.edge):
                break
            node = child
        return i

    def insert(self, key: Sequence[Any], now: float) -> None:
        node, i = self.root, 0
        while i < len(key):
            child = node.children.get(key[i])
            if child is None:
                node.children[key[i]] = _Node(key[i:], node, now)
                self.size += len(key) - i
                return
            n = common_prefix_len(child.edge, key, i)
            child.last_access = now
            if n < len(child.edge):
                child = self._split(child, n)
            node, i = child, i + n

    def _split(self, child: _Node, n: int) -> _Node:
        """child(edge=ab) -> mid(edge=a) -> child(edge=b); returns mid."""
        parent = child.parent
        assert parent is not None
        mid = _Node(child.edge[:n], parent, child.last_access)
        parent.children[child.edge[0]] = mid
        child.edge, child.parent = child.edge[n:], mid
        mid.children[child.edge[0]] = child
        return mid

    def evict(self, max_size: int) -> None:
        if self.size <= max_size:
            return
        tie = itertools.count()
        heap = [(leaf.last_access, next(tie), leaf) for leaf in self._leaves()]
        heapq.heapify(heap)
        while self.size > max_size and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.edge[0]]
            self.size -= len(leaf.edge)
            if parent is not self.root and not parent.children:
                heapq.heappush(heap, (parent.last_access, next(tie), parent))

    def _leaves(self) -> list[_Node]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node is not self.root:
                out.append(node)
        return out
