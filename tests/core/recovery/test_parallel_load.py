"""Loading several partitions from a local snapshot in several processes: each store ends up holding
exactly its partition's rows at the snapshot's end offset; a child that fails names its partitions
and nothing is ingested. Snapshots are written here with pyarrow in the layout Spark writes (no
Spark, no Kafka)."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.recovery.parallel_load import load_snapshot_partitions
from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest, SnapshotStore
from dagster_stateful.core.recovery.snapshot_load import BULK_LOAD_DIRECTORY
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.errors import RecoveryError

CONFIG = AppConfig(name="app", source="orders", stores=("totals",))
KEYS_PER_PARTITION = {0: 3_000, 1: 2_000, 2: 1_000, 3: 0}
"""Uneven on purpose: two processes split them 3,000 against 2,000 + 1,000 (+ the empty one)."""
SNAPSHOT_ID = "snapshot-1"


def rows(partition: int) -> dict[bytes, bytes]:
    return {
        f"p{partition}-key-{i:06d}".encode(): f"value {i} of {partition}".encode()
        for i in range(KEYS_PER_PARTITION[partition])
    }


@pytest.fixture
def snapshots(tmp_path: Path) -> SnapshotStore:
    """A finished snapshot of four partitions, each in two sorted Parquet files."""
    store = SnapshotStore(str(tmp_path / "snapshots"), CONFIG.name, "totals")
    for partition in KEYS_PER_PARTITION:
        pairs = sorted(rows(partition).items())
        directory = tmp_path / "snapshots" / CONFIG.name / "totals" / SNAPSHOT_ID / f"partition={partition}"
        directory.mkdir(parents=True)
        half = len(pairs) // 2
        for number, chunk in enumerate((pairs[:half], pairs[half:])):
            table = pa.table(
                {
                    "key": pa.array([key for key, _ in chunk], pa.binary()),
                    "value": pa.array([value for _, value in chunk], pa.binary()),
                    "offset": pa.array(range(len(chunk)), pa.int64()),
                }
            )
            pq.write_table(table, directory / f"part-{number:05d}.parquet")
    store.write_manifest(
        SnapshotManifest(
            app=CONFIG.name,
            store="totals",
            changelog_topic="app-totals-changelog",
            snapshot_id=SNAPSHOT_ID,
            created_at=time.time(),
            end_offsets={p: 10 * n + 7 for p, n in KEYS_PER_PARTITION.items()},
            key_counts=dict(KEYS_PER_PARTITION),
        )
    )
    return store


def open_stores(state_dir: Path) -> dict[int, StorePartition]:
    state = StateDirectory(state_dir, CONFIG)
    stores = {p: state.partition("totals", p) for p in KEYS_PER_PARTITION}
    for store in stores.values():
        store.open()
        store.db.write([(b"stale", b"removed by the load")], {})
    return stores


def test_partitions_load_in_two_processes_each_holding_exactly_its_snapshot(snapshots, tmp_path):
    manifest = snapshots.latest()
    assert manifest is not None
    stores = open_stores(tmp_path / "state")
    highs = {p: end + 100 for p, end in manifest.end_offsets.items()}
    try:
        reports = load_snapshot_partitions(stores, snapshots, manifest, highs, processes=2)

        for partition, store in stores.items():
            assert dict(store.items()) == rows(partition)
            assert store.changelog_offset == manifest.end_offsets[partition]
            assert reports[partition].kind == "snapshot"
            assert reports[partition].records_applied == KEYS_PER_PARTITION[partition]
            assert not (store.path / BULK_LOAD_DIRECTORY).exists()
    finally:
        for store in stores.values():
            store.close()


def test_a_failing_child_names_its_partitions_and_nothing_is_ingested(snapshots, tmp_path):
    manifest = snapshots.latest()
    assert manifest is not None
    damaged = tmp_path / "snapshots" / CONFIG.name / "totals" / SNAPSHOT_ID / "partition=2" / "part-00001.parquet"
    data = bytearray(damaged.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little") + 8
    data[4:-footer] = b"\xff" * (len(data) - 4 - footer)  # the column data; the footer (row counts) stays readable
    damaged.write_bytes(bytes(data))
    stores = open_stores(tmp_path / "state")
    try:
        with pytest.raises(RecoveryError, match=r"partitions \[1, 2(, 3)?\] from snapshot snapshot-1") as raised:
            load_snapshot_partitions(stores, snapshots, manifest, dict(manifest.end_offsets), processes=2)

        assert "child process" in str(raised.value) and "method 'changelog'" in str(raised.value)
        for store in stores.values():
            assert dict(store.items()) == {}, "nothing is ingested when a group fails"
            assert not (store.path / BULK_LOAD_DIRECTORY).exists()
    finally:
        for store in stores.values():
            store.close()
