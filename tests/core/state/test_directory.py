"""The state directory: layout, listing, clearing, corrupt copies and their retention (real RocksDB)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dagster_stateful.core import AppConfig
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.rocksdb import SortedSstWriter
from dagster_stateful.errors import StateLockedError

CONFIG = AppConfig(name="totals-app", source="orders", stores=("totals", "counts"))


def committed_partition(state: StateDirectory, store: str, partition: int, data: dict[bytes, bytes]) -> None:
    part = state.partition(store, partition)
    part.open()
    try:
        part.commit(sorted(data.items()), changelog_offset=len(data), source_offset=10 * len(data))
    finally:
        part.close()


def corrupt(path: Path) -> None:
    (path / "CURRENT").write_text("garbage-manifest\n")


def test_partitions_live_at_app_store_partition_with_their_checkpoint(tmp_path):
    state = StateDirectory(tmp_path, CONFIG)
    committed_partition(state, "totals", 3, {b"a": b"1", b"b": b"2"})
    committed_partition(state, "totals", 0, {b"c": b"3"})

    assert state.partition_path("totals", 3) == tmp_path / "totals-app" / "totals" / "3"
    assert (tmp_path / "totals-app" / "totals" / "3" / ".checkpoint").is_file()
    checkpoint = state.read_checkpoint("totals", 3)
    assert checkpoint is not None
    assert (checkpoint.changelog_topic, checkpoint.changelog_offset, checkpoint.source_offset) == (
        "totals-app-totals-changelog",
        2,
        20,
    )
    assert state.local_partitions("totals") == [0, 3]
    assert state.local_partitions("counts") == []
    assert state.bytes_on_disk("totals", 3) > 0 and state.bytes_on_disk("counts", 0) == 0


def test_clearing_state_is_refused_while_a_worker_runs(tmp_path):
    state = StateDirectory(tmp_path, CONFIG)
    committed_partition(state, "totals", 0, {b"a": b"1"})
    committed_partition(state, "totals", 1, {b"a": b"1"})
    running = state.activity_lock()
    running.hold_shared()
    try:
        with pytest.raises(StateLockedError, match="is running"):
            state.clear()
    finally:
        running.release()

    assert state.clear(partitions=[1]) == [state.partition_path("totals", 1)]
    assert state.local_partitions("totals") == [0]
    state.clear()
    assert not state.store_dir("totals").exists()


def test_a_corrupt_partition_is_moved_aside_and_reopens_empty(tmp_path):
    state = StateDirectory(tmp_path, CONFIG)
    committed_partition(state, "totals", 0, {b"a": b"1"})
    corrupt(state.partition_path("totals", 0))

    part = state.partition("totals", 0)
    part.open()
    try:
        assert part.recovered_from_corruption and not part.has_local_state
        assert list(part.items()) == []
    finally:
        part.close()
    copies = state.corrupt_copies("totals", 0)
    assert len(copies) == 1 and copies[0].name.startswith("0.corrupt-")
    assert (copies[0] / "CURRENT").read_text() == "garbage-manifest\n", "the damaged files are kept for inspection"


def test_corrupt_copies_are_pruned_by_count_and_age(tmp_path):
    state = StateDirectory(tmp_path, CONFIG, corrupt_retention_seconds=3600, corrupt_copies_kept=2)
    old = state.store_dir("totals") / f"0.corrupt-{int((time.time() - 7200) * 1000)}"
    old.mkdir(parents=True)
    other_partition = state.store_dir("totals") / f"1.corrupt-{int(time.time() * 1000)}"
    other_partition.mkdir()

    made = []
    for round_ in range(3):
        committed_partition(state, "totals", 0, {b"a": str(round_).encode()})
        corrupt(state.partition_path("totals", 0))
        part = state.partition("totals", 0)
        part.open()
        part.close()
        made.append(state.corrupt_copies("totals", 0)[-1])
        time.sleep(0.002)  # copies are named by the millisecond

    assert state.corrupt_copies("totals", 0) == made[-2:], "the two newest copies of partition 0 are kept"
    assert not old.exists(), "a copy older than the retention is deleted"
    assert other_partition.exists(), "another partition's copies are not this partition's to prune"


def test_sorted_sst_writer_rotates_files_and_ingests_in_key_order(tmp_path):
    records = [(f"key-{i:04d}".encode(), f"value-{i}".encode()) for i in range(10)]
    writer = SortedSstWriter(tmp_path / "sst", "bulk", records_per_file=3)
    for key, value in records:
        writer.put(key, value)
    files = writer.finish()

    assert [file.records for file in files] == [3, 3, 3, 1]
    assert [Path(file.path).name for file in files] == [f"bulk-{n:05d}.sst" for n in range(4)]
    state = StateDirectory(tmp_path / "state", CONFIG)
    part: StorePartition = state.partition("totals", 0)
    part.open()
    try:
        part.db.ingest_files([file.path for file in files])
        assert list(part.items()) == records
    finally:
        part.close()


@pytest.mark.parametrize("with_deletes", [False, True], ids=["puts-only", "puts-and-deletes"])
def test_ingested_changes_replace_and_delete_what_the_store_held(tmp_path, with_deletes):
    before = {f"key-{i:04d}".encode(): b"old" for i in range(0, 20, 2)}
    changes: list[tuple[bytes, bytes | None]] = [
        (f"key-{i:04d}".encode(), None if with_deletes and i % 4 == 0 else f"new-{i}".encode()) for i in range(12)
    ]
    state = StateDirectory(tmp_path / "state", CONFIG)
    part: StorePartition = state.partition("totals", 0)
    part.open()
    try:
        part.db.ingest_files([file.path for file in _written(tmp_path / "before", sorted(before.items()))])
        part.db.ingest_changes(changes, tmp_path / "changes")
        expected = {**before, **dict(changes)}
        assert dict(part.items()) == {key: value for key, value in expected.items() if value is not None}
    finally:
        part.close()


@pytest.mark.parametrize("records_per_file", [1, 2, 3, 1000])
def test_changes_written_across_file_boundaries_keep_every_put_and_delete(tmp_path, records_per_file):
    """Runs of puts between deletes are written in bulk: every put and delete lands, whatever file it falls in."""
    before = {f"key-{i:04d}".encode(): b"old" for i in range(12)}
    changes: list[tuple[bytes, bytes | None]] = [
        (f"key-{i:04d}".encode(), None if i in (0, 3, 4, 11) else f"new-{i}".encode()) for i in range(12)
    ]
    writer = SortedSstWriter(tmp_path / "changes", "changes", records_per_file=records_per_file)
    writer.write_changes(changes)
    files = writer.finish()
    state = StateDirectory(tmp_path / "state", CONFIG)
    part: StorePartition = state.partition("totals", 0)
    part.open()
    try:
        part.db.ingest_files([file.path for file in _written(tmp_path / "before", sorted(before.items()))])
        part.db.ingest_files([file.path for file in files])
        assert dict(part.items()) == {key: value for key, value in changes if value is not None}
        assert sum(file.records for file in files) == len(changes)
        assert all(file.records <= records_per_file for file in files)
    finally:
        part.close()


def _written(directory: Path, records: list[tuple[bytes, bytes]]) -> list:
    writer = SortedSstWriter(directory, "bulk")
    writer.write_changes(records)
    return writer.finish()
