"""The record cache of one store partition: the latest value of the keys it read or wrote lately.

Owns `StoreCache`, the engine's counterpart of Kafka Streams' record cache. Its entries are dirty
(written since the last commit: each costs one changelog record and one RocksDB put at the commit,
however often it was written) or clean (equal to RocksDB: read, or committed, and kept so that the
next read skips RocksDB; a key known to be absent is cached as None). It counts the bytes it holds
(keys, values and a fixed overhead per entry); `bound_caches` keeps a worker's caches under
`AppConfig.cache_max_bytes` by evicting clean entries, oldest first, and says when the dirty ones
alone exceed the bound (the worker then commits early).

A live cache (`StoreCache(serialize)`, for the stores of aggregations) holds its values as the objects
the steps made, not as bytes: they are serialized once, when a commit takes its changes, and count
`LIVE_VALUE_BYTES` each, since an object's size is not known without serializing it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

ENTRY_OVERHEAD_BYTES: Final = 200
"""Bytes counted per entry beyond its key and value: the two bytes objects' headers and the slots of
the dicts holding them (measured with tracemalloc: about 170)."""

LIVE_VALUE_BYTES: Final = 64
"""Bytes counted for a live value (a number or a small list, serialized, plus its object's header)."""

Change = tuple[bytes, bytes | None, int]
"""A key's change since the last commit: (store key, serialized value or None for a delete, source offset)."""


_ABSENT: Any = object()


def entry_bytes(key: bytes, data: bytes | None) -> int:
    return len(key) + (0 if data is None else len(data)) + ENTRY_OVERHEAD_BYTES


def live_entry_bytes(key: bytes, value: Any) -> int:
    return len(key) + (0 if value is None else LIVE_VALUE_BYTES) + ENTRY_OVERHEAD_BYTES


class StoreCache:
    """Values by store key (None: the key is absent), which of them are dirty, and the bytes held.

    Writes go straight into the cache and are journaled until the message that made them succeeds
    (`accept`) or fails (`undo`), so that a step failing half-way leaves no trace."""

    __slots__ = ("_entry_bytes", "bytes", "dirty", "journal", "serialize", "values")

    def __init__(self, serialize: Callable[[bytes, Any], bytes] | None = None) -> None:
        """serialize(key, value): given, the cache is live: it holds objects, serialized by `changes`
        (in one call when it also has `many(keys, values)`, as `LiveSerializer` does)."""
        self.serialize = serialize
        self._entry_bytes = entry_bytes if serialize is None else live_entry_bytes
        self.values: dict[bytes, Any] = {}
        self.dirty: dict[bytes, int] = {}
        """Store keys written since the last commit, with the source offset of their latest write."""
        self.journal: list[tuple[bytes, Any, int]] = []
        """The current message's writes: (key, previous value or _ABSENT, previous dirty offset or -1).
        The list is cleared in place, never replaced: transactions hold on to it."""
        self.bytes = 0

    def remember(self, key: bytes, data: Any) -> None:
        """A value read from RocksDB (clean; a live cache's deserialized)."""
        self.values[key] = data
        self.bytes += self._entry_bytes(key, data)

    def remember_live_batch(self, keys: list[bytes], values: list[Any]) -> None:
        """`remember` of many aggregates read at once into a live cache (None: the key has none)."""
        self.values.update(zip(keys, values, strict=True))
        present = len(values) - values.count(None)
        self.bytes += sum(map(len, keys)) + len(keys) * ENTRY_OVERHEAD_BYTES + present * LIVE_VALUE_BYTES

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

    def put_live(self, key: bytes, value: Any, offset: int) -> None:
        """`put` for a live cache: `value` is an object, never None."""
        values, dirty = self.values, self.dirty
        old = values.get(key, _ABSENT)
        self.journal.append((key, old, dirty.get(key, -1)))
        if old is _ABSENT or old is None:
            self.bytes += live_entry_bytes(key, value) - (0 if old is _ABSENT else live_entry_bytes(key, None))
        values[key] = value
        dirty[key] = offset

    def put_live_batch(
        self, keys: list[bytes], values: list[Any], offsets: list[int], were_absent: int, journaled: bool = False
    ) -> None:
        """Writes of a whole batch to a live cache, each key once, with the offset of the last message
        that changed it; every key is cached already (as None for the `were_absent` of them that
        had no aggregate). Journaled only when asked (`undo` then takes the batch back whole, as one
        message's writes): a batch is otherwise kept whole or not processed."""
        if journaled:
            dirty = self.dirty
            self.journal.extend(
                zip(keys, map(self.values.__getitem__, keys), [dirty.get(key, -1) for key in keys], strict=True)
            )
        self.values.update(zip(keys, values, strict=True))
        self.dirty.update(zip(keys, offsets, strict=True))
        self.bytes += were_absent * LIVE_VALUE_BYTES

    def delete_live(self, key: bytes, offset: int) -> None:
        """A delete in a live cache, undone if the message at `offset` fails."""
        values, dirty = self.values, self.dirty
        old = values.get(key, _ABSENT)
        self.journal.append((key, old, dirty.get(key, -1)))
        self.bytes += live_entry_bytes(key, None) - (0 if old is _ABSENT else live_entry_bytes(key, old))
        values[key] = None
        dirty[key] = offset

    def accept(self) -> None:
        """The current message succeeded: its writes stay."""
        self.journal.clear()

    def undo(self) -> None:
        """The current message failed: put back what its writes replaced."""
        values, dirty, journal, size = self.values, self.dirty, self.journal, self._entry_bytes
        while journal:
            key, old, old_offset = journal.pop()
            self.bytes -= size(key, values.pop(key))
            if old is not _ABSENT:
                values[key] = old
                self.bytes += size(key, old)
            if old_offset < 0:
                dirty.pop(key, None)
            else:
                dirty[key] = old_offset

    def changes(self) -> list[Change]:
        """The dirty entries as (key, value or None, source offset), in the order they were first written;
        a live cache's values serialized (its `serialize` raises what it refuses)."""
        values, dumps = self.values, self.serialize
        if dumps is None:
            return [(key, values[key], offset) for key, offset in self.dirty.items()]
        keys = list(self.dirty)
        live = list(map(values.__getitem__, keys))
        many = getattr(dumps, "many", None)
        if many is None or None in live:  # None: deletes among the changes
            encoded: list[bytes | None] = [
                None if value is None else dumps(key, value) for key, value in zip(keys, live, strict=True)
            ]
        else:
            encoded = list(many(keys, live))
        return list(zip(keys, encoded, self.dirty.values(), strict=True))

    def mark_clean(self) -> None:
        """The dirty entries are committed: they stay, as clean entries."""
        self.dirty.clear()

    def drop_dirty(self) -> None:
        """Forget every uncommitted write (RocksDB still holds what was committed)."""
        self.journal.clear()
        values, size = self.values, self._entry_bytes
        for key in self.dirty:
            self.bytes -= size(key, values.pop(key))
        self.dirty.clear()

    def evict_clean(self, excess: int) -> int:
        """Drop clean entries in the order they entered the cache, until `excess` bytes are freed or none is
        left; returns the bytes freed."""
        values, dirty, size = self.values, self.dirty, self._entry_bytes
        victims: list[bytes] = []
        freed = 0
        for key, data in values.items():
            if freed >= excess:
                break
            if key not in dirty:
                victims.append(key)
                freed += size(key, data)
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
