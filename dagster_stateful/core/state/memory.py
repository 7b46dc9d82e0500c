"""In-memory store backends: a dict, and a bounded dict that evicts the least recently used entries.

Owns `MemoryDatabase` and `LruDatabase` (Kafka Streams' in-memory key-value store and its
`MemoryLRUCache`), both `backend.StoreBackend`s. Neither keeps anything across `close()`: every
assignment of the partition restores it in full from the changelog, which is the price of their
speed (see docs/apps.md, "Stores: expiry, kinds and your own"). An `LruDatabase` holds at most
`max_entries` keys; the entries a commit would push out are named by `evictions`, so the engine
deletes them in that commit and sends their tombstones to the changelog, and a restore never brings
them back. Recency counts the reads that reach the store and every write (reads the record cache
answers do not reach it, as in Kafka Streams).
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from dagster_stateful.core.state.backend import BackendFactory, Changes
from dagster_stateful.errors import ConfigurationError, StateStoreError

__all__ = ["LruDatabase", "MemoryDatabase", "lru_backend", "memory_backend"]


class MemoryDatabase:
    """A store partition held in a dict (`store`, `partition` name it in errors)."""

    persistent = False
    evicts = False

    def __init__(self, path: Path | None = None, store: str | None = None, partition: int | None = None) -> None:
        self.store = store
        self.partition = partition
        self._data: dict[bytes, bytes] = self._new_data()
        self._meta: dict[bytes, bytes] = {}

    def _new_data(self) -> dict[bytes, bytes]:
        return {}

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        get = self.get
        return [get(key) for key in keys]

    def get_meta(self, key: bytes) -> bytes | None:
        return self._meta.get(key)

    def write(self, changes: Changes, meta: Mapping[bytes, bytes], durable: bool = True) -> None:
        changes = list(changes)  # taken whole before anything is applied: all or nothing
        data = self._data
        for key, value in changes:
            if value is None:
                data.pop(key, None)
            else:
                self._put(key, value)
        self._meta.update(meta)

    def _put(self, key: bytes, value: bytes) -> None:
        self._data[key] = value

    def items(self, from_key: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        keys = sorted(self._data)
        start = 0 if from_key is None else bisect.bisect_left(keys, from_key)
        for key in keys[start:]:
            value = self._data.get(key)
            if value is not None:
                yield key, value

    def ingest_changes(self, changes: Changes, scratch_dir: Path) -> None:
        self.write(changes, {})

    def ingest_sorted(self, records: Iterable[tuple[bytes, bytes]], scratch_dir: Path) -> int:
        count = 0
        for key, value in records:
            self._put(key, value)
            count += 1
        return count

    def ingest_files(self, files: list[str]) -> None:
        raise StateStoreError(
            f"store {self.store!r} partition {self.partition} is held in memory and cannot take in SST files: restore "
            "it from its changelog (the restore job with method=changelog, or the worker's own restore)."
        )

    def evictions(self, changes: Changes) -> list[bytes]:
        return []

    def flush(self) -> None:
        """Nothing to do: nothing in memory outlives the process."""

    def estimated_keys(self) -> int:
        return len(self._data)

    def close(self) -> None:
        self._data = self._new_data()
        self._meta.clear()


class LruDatabase(MemoryDatabase):
    """A `MemoryDatabase` of at most `max_entries` keys, evicting the least recently used."""

    evicts = True

    def __init__(
        self, max_entries: int, path: Path | None = None, store: str | None = None, partition: int | None = None
    ) -> None:
        if max_entries <= 0:
            raise ConfigurationError(f"an LRU store holds at least one entry, got max_entries={max_entries}")
        self.max_entries = max_entries
        super().__init__(path, store, partition)
        self._recency: OrderedDict[bytes, bytes] = self._data  # type: ignore[assignment]

    def _new_data(self) -> dict[bytes, bytes]:
        return OrderedDict()

    def get(self, key: bytes) -> bytes | None:
        value = self._recency.get(key)
        if value is not None:
            self._recency.move_to_end(key)
        return value

    def write(self, changes: Changes, meta: Mapping[bytes, bytes], durable: bool = True) -> None:
        """Apply `changes`; past `max_entries`, the oldest entries go (a restore's; a commit's were
        already deleted, as `evictions` named them)."""
        super().write(changes, meta, durable)
        self._trim()

    def ingest_sorted(self, records: Iterable[tuple[bytes, bytes]], scratch_dir: Path) -> int:
        count = super().ingest_sorted(records, scratch_dir)
        self._trim()
        return count

    def _put(self, key: bytes, value: bytes) -> None:
        self._recency[key] = value
        self._recency.move_to_end(key)

    def _trim(self) -> None:
        while len(self._recency) > self.max_entries:
            self._recency.popitem(last=False)

    def evictions(self, changes: Changes) -> list[bytes]:
        """The least recently used keys past `max_entries` once `changes` are applied: kept keys the
        changes leave alone first (oldest first), then keys the changes write, in the order given."""
        written: dict[bytes, bool] = {key: value is not None for key, value in changes}
        data = self._recency
        size = sum(1 for key in data if key not in written) + sum(written.values())
        excess = size - self.max_entries
        if excess <= 0:
            return []
        evicted: list[bytes] = []
        for key in data:
            if key not in written:
                evicted.append(key)
                if len(evicted) == excess:
                    return evicted
        for key, kept in written.items():
            if kept:
                evicted.append(key)
                if len(evicted) == excess:
                    break
        return evicted

    def close(self) -> None:
        super().close()
        self._recency = self._data  # type: ignore[assignment]


def memory_backend() -> BackendFactory:
    """Stores held in a dict."""

    def make(path: Path, store: str, partition: int) -> MemoryDatabase:
        return MemoryDatabase(path, store, partition)

    return make


def lru_backend(max_entries: int) -> BackendFactory:
    """Stores of at most `max_entries` keys per partition, evicting the least recently used."""
    if max_entries <= 0:
        raise ConfigurationError(f"an LRU store holds at least one entry, got max_entries={max_entries}")

    def make(path: Path, store: str, partition: int) -> LruDatabase:
        return LruDatabase(max_entries, path, store, partition)

    return make
