"""The record cache's bookkeeping: the bytes it counts, what it evicts, and what a failed message leaves."""

from __future__ import annotations

import random

from dagster_stateful.core.state.cache import StoreCache, entry_bytes


def recount(cache: StoreCache) -> int:
    return sum(entry_bytes(key, data) for key, data in cache.values.items())


def test_counted_bytes_match_the_entries_through_every_operation():
    rng = random.Random(7)
    cache = StoreCache()
    for step in range(5_000):
        key = f"k{rng.randrange(200)}".encode()
        action = rng.random()
        if action < 0.5:
            cache.put(key, b"v" * rng.randrange(0, 300), step)
        elif action < 0.6:
            cache.put(key, None, step)
        elif action < 0.7 and key not in cache.values:
            cache.remember(key, b"r" * rng.randrange(1, 50))
        elif action < 0.8:
            cache.undo()
        elif action < 0.9:
            cache.accept()
        elif action < 0.95:
            cache.accept()
            cache.mark_clean()
        else:
            cache.evict_clean(rng.randrange(1, 5_000))
        assert cache.bytes == recount(cache), f"after step {step}"
    cache.accept()
    cache.drop_dirty()
    assert cache.bytes == recount(cache) and not cache.dirty


def test_a_failed_message_leaves_the_cache_as_it_was():
    cache = StoreCache()
    cache.remember(b"a", b"1")
    cache.put(b"b", b"2", 10)
    cache.accept()
    before = (dict(cache.values), dict(cache.dirty), cache.bytes)

    cache.put(b"a", b"100", 11)
    cache.put(b"b", None, 11)
    cache.put(b"c", b"3", 11)
    cache.put(b"a", b"1000", 11)
    cache.undo()

    assert (cache.values, cache.dirty, cache.bytes) == before


def test_eviction_takes_clean_entries_oldest_first_and_never_a_dirty_one():
    cache = StoreCache()
    for i in range(5):
        cache.remember(f"clean{i}".encode(), b"x")
    cache.put(b"dirty", b"y", 1)
    cache.accept()

    freed = cache.evict_clean(2 * entry_bytes(b"clean0", b"x"))
    assert freed == 2 * entry_bytes(b"clean0", b"x")
    assert list(cache.values) == [b"clean2", b"clean3", b"clean4", b"dirty"]

    cache.evict_clean(10**9)
    assert list(cache.values) == [b"dirty"] and cache.changes() == [(b"dirty", b"y", 1)]
    cache.mark_clean()
    cache.evict_clean(10**9)
    assert cache.values == {} and cache.bytes == 0
