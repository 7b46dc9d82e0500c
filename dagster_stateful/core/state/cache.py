"""The record cache of one store partition: the latest value of the keys it read or wrote lately.

Owns `StoreCache`, the engine's counterpart of Kafka Streams' record cache. Its entries are dirty
(written since the last commit: each costs one changelog record and one RocksDB put at the commit,
however often it was written) or clean (equal to RocksDB: read, or committed, and kept so that the
next read skips RocksDB; a key known to be absent is cached as None). It counts the bytes it holds
(keys, values and a fixed overhead per entry); `bound_caches` keeps a worker's caches under
`AppConfig.cache_max_bytes` by evicting clean entries, oldest first, and says when the dirty ones
alone exceed the bound (the worker then commits early).
"""

from __future__ import annotations

from typing import Any, Final

ENTRY_OVERHEAD_BYTES: Final = 200
"""Bytes counted per entry beyond its key and value: the two bytes objects' headers and the slots of
the dicts holding them (measured with tracemalloc: about 170)."""

Change = tuple[bytes, bytes | None, int]
"""A key's change since the last commit: (store key, serialized value or None for a delete, source offset)."""


_ABSENT: Any = object()


def entry_bytes(key: bytes, data: bytes | None) -> int:
    return len(key) + (0 if data is None else len(data)) + ENTRY_OVERHEAD_BYTES


class StoreCache:
    """Values by store key (None: the key is absent), which of them are dirty, and the bytes held.

    Writes go straight into the cache and are journaled until the message that made them succeeds
    (`accept`) or fails (`undo`), so that a step failing half-way leaves no trace."""

    __slots__ = ("bytes", "dirty", "journal", "values")

    def __init__(self) -> None:
        self.values: dict[bytes, bytes | None] = {}
        self.dirty: dict[bytes, int] = {}
        """Store keys written since the last commit, with the source offset of their latest write."""
        self.journal: list[tuple[bytes, Any, int]] = []
        """The current message's writes: (key, previous value or _ABSENT, previous dirty offset or -1).
        The list is cleared in place, never replaced: transactions hold on to it."""
        self.bytes = 0

    def remember(self, key: bytes, data: bytes | None) -> None:
        """A value read from RocksDB (clean)."""
        self.values[key] = data
        self.bytes += entry_bytes(key, data)

    def put(self, key: bytes, data: bytes | None, offset: int) -> None:
        """A write (None: a delete) of the message at source `offset`, undone if that message fails."""
        values, dirty = self.values, self.dirty
        old = values.get(key, _ABSENT)
        self.journal.append((key, old, dirty.get(key, -1)))
        if old is _ABSENT:
            self.bytes += entry_bytes(key, data)
        else:
            self.bytes += (0 if data is None else len(data)) - (0 if old is None else len(old))
        values[key] = data
        dirty[key] = offset

    def accept(self) -> None:
        """The current message succeeded: its writes stay."""
        self.journal.clear()

    def undo(self) -> None:
        """The current message failed: put back what its writes replaced."""
        values, dirty, journal = self.values, self.dirty, self.journal
        while journal:
            key, old, old_offset = journal.pop()
            self.bytes -= entry_bytes(key, values.pop(key))
            if old is not _ABSENT:
                values[key] = old
                self.bytes += entry_bytes(key, old)
            if old_offset < 0:
                dirty.pop(key, None)
            else:
                dirty[key] = old_offset

    def changes(self) -> list[Change]:
        """The dirty entries as (key, value or None, source offset), in the order they were first written."""
        values = self.values
        return [(key, values[key], offset) for key, offset in self.dirty.items()]

    def mark_clean(self) -> None:
        """The dirty entries are committed: they stay, as clean entries."""
        self.dirty.clear()

    def drop_dirty(self) -> None:
        """Forget every uncommitted write (RocksDB still holds what was committed)."""
        self.journal.clear()
        values = self.values
        for key in self.dirty:
            self.bytes -= entry_bytes(key, values.pop(key))
        self.dirty.clear()

    def evict_clean(self, excess: int) -> int:
        """Drop clean entries in the order they entered the cache, until `excess` bytes are freed or none is
        left; returns the bytes freed."""
        values, dirty = self.values, self.dirty
        victims: list[bytes] = []
        freed = 0
        for key, data in values.items():
            if freed >= excess:
                break
            if key not in dirty:
                victims.append(key)
                freed += entry_bytes(key, data)
        for key in victims:
            del values[key]
        self.bytes -= freed
        return freed


def bound_caches(caches: list[StoreCache], limit: int) -> tuple[int, bool]:
    """Keep `caches` (a worker's) under `limit` bytes together by evicting clean entries, from the
    largest cache first, down to 90% of the limit. Returns the bytes they held before, and whether
    they still exceed the limit: the dirty entries alone do, and only a commit (which makes them
    clean) can bring them back under it."""
    held = sum(cache.bytes for cache in caches)
    if held <= limit:
        return held, False
    excess = held - (limit - limit // 10)
    for cache in sorted(caches, key=lambda cache: cache.bytes, reverse=True):
        excess -= cache.evict_clean(excess)
        if excess <= 0:
            return held, False
    return held, excess > limit // 10
