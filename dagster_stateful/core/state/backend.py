"""The store interface: what holds one store partition's data, so a user can plug in their own.

Owns `StoreBackend`, the protocol every backend implements, and `BackendFactory`, how the engine
makes one: `factory(path, store, partition)`, called each time the partition is opened (by its
owner, holding the partition's lock, in the partition's own directory). The engine's backends are
`rocksdb.PartitionDatabase` (the default: persistent, on disk), `memory.MemoryDatabase` (a dict,
restored from the changelog on every assignment) and `memory.LruDatabase` (a bounded dict that
evicts the least recently used entries, each eviction a tombstone in the changelog).

A backend holds bytes keys and values and, apart from them, a few metadata entries (the
partition's changelog and source offsets) that must always be written in the same atomic write as
the data. `conformance` holds the checks any backend must pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Protocol

__all__ = ["BackendFactory", "StoreBackend"]

Changes = Iterable[tuple[bytes, bytes | None]]
"""Puts (key, value) and deletes (key, None)."""


class StoreBackend(Protocol):
    """One store partition's data and metadata.

    Errors: raise `errors.StoreCorruptedError` when the data is damaged (the engine then moves the
    directory aside and restores the partition from its changelog), `errors.StateStoreError` for
    any other failure (nothing is moved; the worker stops with the message).
    """

    persistent: bool
    """Whether data and metadata survive `close()` and a crash (when not, every open starts empty
    and the partition is restored from its changelog)."""
    evicts: bool
    """Whether writes may push entries out (then `evictions` says which)."""

    def get(self, key: bytes) -> bytes | None:
        """The value of `key`, None when absent."""
        ...

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """The value of each key (None where absent), in one read (RocksDB's multi-get)."""
        ...

    def get_meta(self, key: bytes) -> bytes | None:
        """A metadata entry (written by `write`'s `meta`), None when absent."""
        ...

    def write(self, changes: Changes, meta: Mapping[bytes, bytes], durable: bool = True) -> None:
        """Apply `changes` and set the `meta` entries, all or nothing. `durable=False` (restores) may
        skip the write-ahead log: `flush` then makes it durable."""
        ...

    def items(self, from_key: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) from `from_key` (or the first key) on, in ascending byte order."""
        ...

    def ingest_changes(self, changes: Changes, scratch_dir: Path) -> None:
        """A bulk `write` of strictly ascending keys, without metadata (a restore's large chunks);
        `scratch_dir` is free for temporary files."""
        ...

    def ingest_sorted(self, records: Iterable[tuple[bytes, bytes]], scratch_dir: Path) -> int:
        """Bulk-load strictly ascending (key, value) pairs into an empty partition (snapshots);
        returns how many."""
        ...

    def ingest_files(self, files: list[str]) -> None:
        """Take in RocksDB SST files written elsewhere (Spark bulk restores); a backend that cannot
        raises `errors.StateStoreError` saying to restore from the changelog instead."""
        ...

    def evictions(self, changes: Changes) -> list[bytes]:
        """The keys that applying `changes` would push out (always [] unless `evicts`), which may
        include keys the changes write: the engine deletes them in the same commit and tombstones
        them in the changelog."""
        ...

    def flush(self) -> None:
        """Make every write so far durable (a no-op when not `persistent`)."""
        ...

    def estimated_keys(self) -> int:
        """About how many keys the partition holds."""
        ...

    def close(self) -> None:
        """Release everything; the object is not used again."""
        ...


BackendFactory = Callable[[Path, str, int], StoreBackend]
"""factory(partition directory, store name, partition number) -> an open backend."""
