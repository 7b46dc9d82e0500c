"""The checks every store backend must pass, for the engine's backends and for yours.

Owns `CHECKS` (name -> check) and `check_backend`. A check takes a `backend.BackendFactory` and an
empty directory to work in, and raises `BackendNonconformance` saying what the backend did wrong.
Run them all against your backend before you use it, e.g. in a test:

    for name, check in CHECKS.items():
        check(my_factory, tmp_path / name)

They cover what the engine relies on: reads after writes, metadata written with the data, atomic
writes, key order and seeks, bulk loads, deletes, what survives a reopen (a persistent backend
keeps all of it, another starts empty), evictions of bounded backends, and commits and restores
through a `partition.StorePartition`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from dagster_stateful.core.state.backend import BackendFactory, StoreBackend
from dagster_stateful.core.state.partition import StorePartition

__all__ = ["CHECKS", "BackendNonconformance", "check_backend"]

STORE, PARTITION = "conformance", 0


class BackendNonconformance(AssertionError):
    """A store backend broke the store interface's contract."""


Check = Callable[[BackendFactory, Path], None]


def _expect(condition: bool, what: str) -> None:
    if not condition:
        raise BackendNonconformance(what)


def _open(factory: BackendFactory, directory: Path) -> StoreBackend:
    directory.mkdir(parents=True, exist_ok=True)
    return factory(directory, STORE, PARTITION)


def reads_what_it_wrote(factory: BackendFactory, directory: Path) -> None:
    backend = _open(factory, directory)
    try:
        backend.write([(b"a", b"1"), (b"b", b"2"), (b"c", b"3")], {b"offset": b"7"})
        backend.write([(b"b", None), (b"c", b"33")], {b"offset": b"8"})
        _expect(backend.get(b"a") == b"1", "get(b'a') should return the value written")
        _expect(backend.get(b"b") is None, "get(b'b') should return None after its delete")
        _expect(backend.get(b"c") == b"33", "get(b'c') should return the latest value")
        _expect(backend.get(b"absent") is None, "get of a key never written should return None")
        _expect(backend.get_meta(b"offset") == b"8", "get_meta should return the latest metadata written")
        _expect(backend.get(b"offset") is None, "metadata must not show among the data")
        _expect(backend.estimated_keys() >= 0, "estimated_keys should be a count")
    finally:
        backend.close()


def iterates_in_key_order_from_a_key(factory: BackendFactory, directory: Path) -> None:
    backend = _open(factory, directory)
    try:
        keys = [b"\x00", b"a", b"ab", b"b", b"\xff\x01"]
        backend.write([(key, key + b"!") for key in reversed(keys)], {b"m": b"x"})
        _expect(list(backend.items()) == [(key, key + b"!") for key in keys], "items() should be in byte order")
        _expect([key for key, _ in backend.items(b"aa")] == keys[2:], "items(from_key) should start at from_key")
        _expect(list(backend.items(b"\xff\x02")) == [], "items past the last key should be empty")
    finally:
        backend.close()


def writes_all_or_nothing(factory: BackendFactory, directory: Path) -> None:
    backend = _open(factory, directory)
    try:
        backend.write([(b"a", b"1")], {b"offset": b"1"})

        def failing() -> Iterator[tuple[bytes, bytes | None]]:
            yield b"a", b"changed"
            yield b"b", b"new"
            raise RuntimeError("the changes failed half-way")

        with contextlib.suppress(RuntimeError):
            backend.write(failing(), {b"offset": b"2"})
        _expect(backend.get(b"a") == b"1" and backend.get(b"b") is None, "a failed write should apply no change")
        _expect(backend.get_meta(b"offset") == b"1", "a failed write should leave the metadata as it was")
    finally:
        backend.close()


def bulk_loads_sorted_records_and_changes(factory: BackendFactory, directory: Path) -> None:
    """(A bounded backend must hold at least 1,001 keys for this check.)"""
    backend = _open(factory, directory)
    try:
        records = [(f"k{i:05d}".encode(), str(i).encode()) for i in range(1000)]
        count = backend.ingest_sorted(iter(records), directory / "scratch-load")
        _expect(count == 1000, f"ingest_sorted should return how many records it loaded (1000), got {count}")
        backend.ingest_changes([(b"k00001", None), (b"k00002", b"two"), (b"zz", b"new")], directory / "scratch-changes")
        _expect(backend.get(b"k00001") is None, "ingest_changes should apply deletes")
        _expect(backend.get(b"k00002") == b"two" and backend.get(b"zz") == b"new", "ingest_changes should apply puts")
        _expect(sum(1 for _ in backend.items()) == 1000, "1000 loaded, one deleted, one added")
    finally:
        backend.close()


def keeps_across_a_reopen_only_when_persistent(factory: BackendFactory, directory: Path) -> None:
    backend = _open(factory, directory)
    persistent = backend.persistent
    backend.write([(b"a", b"1")], {b"offset": b"5"})
    backend.flush()
    backend.close()
    reopened = _open(factory, directory)
    try:
        if persistent:
            _expect(reopened.get(b"a") == b"1", "a persistent backend should keep its data across close and reopen")
            _expect(reopened.get_meta(b"offset") == b"5", "a persistent backend should keep its metadata too")
        else:
            _expect(reopened.get(b"a") is None, "a backend that is not persistent should reopen empty")
            _expect(reopened.get_meta(b"offset") is None, "and without metadata, so the engine restores it fully")
    finally:
        reopened.close()


def names_evictions_only_when_bounded(factory: BackendFactory, directory: Path) -> None:
    """(A bounded backend must hold between 1,000 and 1,999 keys for this check to exercise it.)"""
    backend = _open(factory, directory)
    try:
        backend.write([(f"old{i:05d}".encode(), b"v") for i in range(1000)], {})
        changes = [(f"new{i:05d}".encode(), b"v") for i in range(1000)]
        evicted = backend.evictions(changes)
        if not backend.evicts:
            _expect(evicted == [], "a backend that does not evict should name no evictions")
            return
        _expect(bool(evicted), "a bounded backend holding 1,000 keys should evict some to take 1,000 more")
        applied = dict(changes) | dict.fromkeys(evicted)
        backend.write(list(applied.items()), {})
        kept = [key for key, value in applied.items() if value is not None]
        _expect(all(backend.get(key) == b"v" for key in kept), "every write not evicted should be kept")
        again = backend.evictions([])
        _expect(again == [], f"after its evictions are applied, a bounded backend should have none left, got {again}")
    finally:
        backend.close()


def commits_and_restores_through_a_partition(factory: BackendFactory, directory: Path) -> None:
    def move_aside(path: Path, error: BaseException) -> Path:
        raise BackendNonconformance(f"the partition was found damaged: {error}")

    partition = StorePartition(
        directory / "partition", STORE, PARTITION, "changelog", "source", move_aside, 5.0, factory
    )
    partition.path.mkdir(parents=True)
    partition.open()
    try:
        _expect(not partition.has_local_state, "a new partition should need a full restore")
        partition.write_restored([(b"a", b"1"), (b"b", b"2")], 10)
        partition.ingest_restored([(b"c", b"3"), (b"d", None)], 12)
        partition.finish_restore(12, 40)
        _expect((partition.changelog_offset, partition.source_offset) == (12, 40), "a restore should set offsets")
        partition.commit([(b"a", None), (b"e", b"5")], 15, 41)
        _expect([key for key, _ in partition.items()] == [b"b", b"c", b"e"], "a commit should apply its changes")
        checkpoint = partition.read_checkpoint()
        _expect(checkpoint is not None and checkpoint.source_offset == 41, "a commit should publish the checkpoint")
        persistent = partition.db.persistent
        partition.close()
        partition.open()
        expected = (15, 41) if persistent else (None, None)
        found = (partition.changelog_offset, partition.source_offset)
        _expect(found == expected, f"offsets after a reopen should be {expected}, got {found}")
        kept = partition.read_checkpoint() is not None
        _expect(kept == persistent, "the checkpoint file should say whether the partition holds state")
    finally:
        partition.close()


CHECKS: dict[str, Check] = {
    check.__name__: check
    for check in (
        reads_what_it_wrote,
        iterates_in_key_order_from_a_key,
        writes_all_or_nothing,
        bulk_loads_sorted_records_and_changes,
        keeps_across_a_reopen_only_when_persistent,
        names_evictions_only_when_bounded,
        commits_and_restores_through_a_partition,
    )
}


def check_backend(factory: BackendFactory, directory: Path) -> list[str]:
    """Run every check (each in its own subdirectory of `directory`); returns their names, or raises
    `BackendNonconformance` for the first that fails."""
    for name, check in CHECKS.items():
        check(factory, directory / name)
    return list(CHECKS)
