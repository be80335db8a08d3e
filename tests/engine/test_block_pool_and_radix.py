from __future__ import annotations

import random

import pytest

from kvserve.engine.core.kv_cache_manager import KVCacheIntegrityError, KVCacheManager


def test_allocate_release_roundtrip() -> None:
    kv = KVCacheManager(8, 4, enable_prefix_cache=False)
    pages = kv.allocate(5)
    assert pages is not None and len(set(pages)) == 5
    assert kv.num_free_pages == 3
    assert kv.allocate(4) is None  # not enough, nothing taken
    assert kv.num_free_pages == 3
    kv.check_integrity([pages])
    kv.release(pages)
    assert kv.num_free_pages == 8
    kv.check_integrity([])


def test_match_insert_and_lock() -> None:
    kv = KVCacheManager(8, 4, enable_prefix_cache=True)
    tokens = list(range(10))  # two full pages + 2 tokens
    pages = kv.allocate(3)
    assert pages is not None
    assert kv.cache_pages(tokens[:8], pages[:2])[0] == pages[:2]
    assert kv.match_prefix(tokens) == pages[:2]
    assert kv.match_prefix([0, 1, 2, 3, 99, 5, 6, 7]) == pages[:1]
    assert kv.match_prefix([5, 1, 2, 3]) == []
    kv.release(pages)  # the two cached pages stay, evictable; the partial one is freed
    assert kv.num_free_pages == 6 and kv.num_available_pages == 8
    kv.check_integrity([])
    hit = kv.match_prefix(tokens)
    kv.acquire(hit)  # locked: not evictable while held
    assert kv.num_available_pages == 6
    assert kv.allocate(7) is None
    kv.check_integrity([hit])
    kv.release(hit)


def test_duplicate_insert_swaps_to_the_cached_page() -> None:
    kv = KVCacheManager(8, 4, enable_prefix_cache=True)
    tokens = [1, 2, 3, 4]
    first, second = kv.allocate(1), kv.allocate(1)
    assert first and second
    kv.cache_pages(tokens, first)
    canonical, _ = kv.cache_pages(tokens, second)
    assert canonical == first  # the duplicate page went back to the free list
    assert kv.num_free_pages == 7
    kv.check_integrity([first, canonical])
    kv.release(first)
    kv.release(canonical)
    kv.check_integrity([])


def test_eviction_is_lru_and_leaf_first() -> None:
    kv = KVCacheManager(4, 2, enable_prefix_cache=True)
    a = kv.allocate(2)
    assert a
    kv.cache_pages([1, 1, 2, 2], a)  # chain of two pages
    kv.release(a)
    b = kv.allocate(1)
    assert b
    kv.cache_pages([7, 7], b)
    kv.release(b)
    kv.match_prefix([1, 1, 2, 2])  # touch the chain: the [7, 7] page is now least recent
    got = kv.allocate(3)  # 1 free + needs 2 evictions: [7,7] first, then the chain's leaf
    assert got is not None
    assert kv.match_prefix([7, 7]) == []
    assert kv.match_prefix([1, 1, 2, 2]) == a[:1]
    kv.check_integrity([got])


def test_integrity_catches_leaked_reference() -> None:
    kv = KVCacheManager(4, 2, enable_prefix_cache=False)
    pages = kv.allocate(2)
    assert pages
    with pytest.raises(KVCacheIntegrityError, match="live holders"):
        kv.check_integrity([])  # nobody claims the pages: a leak


def test_random_churn_keeps_the_evictable_leaf_set_exact() -> None:
    """Sequences sharing prefixes are cached, re-acquired, released and evicted in random
    order; after every operation the kept set of evictable leaves equals a walk of the tree."""
    rng = random.Random(3)
    kv = KVCacheManager(256, 2, enable_prefix_cache=True)
    held: list[list[int]] = []
    for _ in range(400):
        if held and rng.random() < 0.45:
            kv.release(held.pop(rng.randrange(len(held))))
        else:
            tokens = [rng.randrange(3) for _ in range(2 * rng.randint(1, 6))]
            hit = kv.match_prefix(tokens)
            kv.acquire(hit)
            new = kv.allocate(len(tokens) // 2 - len(hit))
            if new is None:
                kv.release(hit)
                continue
            pages, _ = kv.cache_pages(tokens, hit + new)
            held.append(pages)
        kv.check_integrity(held)
    for pages in held:
        kv.release(pages)
    assert kv.reset_prefix_cache() > 0
    assert kv.num_free_pages == 256
    kv.check_integrity([])
