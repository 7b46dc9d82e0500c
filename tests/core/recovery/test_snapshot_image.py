"""Loading store partitions from a snapshot's SST image: the store holds exactly the snapshot's rows
without its Parquet files being read, the image stays intact for the next load, and an image that
cannot be read falls back to the Parquet rows with a warning. Snapshots and images are written here
with `SnapshotStore.write_partition` and the core's SST writer, in the layout the Spark snapshot job
writes (no Spark, no Kafka)."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

import pytest

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.recovery.parallel_load import load_snapshot_partitions
from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest, SnapshotStore
from dagster_stateful.core.recovery.snapshot_load import BULK_LOAD_DIRECTORY
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.rocksdb import SortedSstWriter

CONFIG = AppConfig(name="app", source="orders", stores=("totals",))
KEYS_PER_PARTITION = {0: 2_500, 1: 1_000, 2: 0}
RECORDS_PER_FILE = 700
"""Several SST files per partition, so their order matters."""
SNAPSHOT_ID = "snapshot-1"


def rows(partition: int) -> dict[bytes, bytes]:
    return {
        f"p{partition}-key-{i:06d}".encode(): f"value {i} of {partition}".encode()
        for i in range(KEYS_PER_PARTITION[partition])
    }


@pytest.fixture
def snapshots(tmp_path: Path) -> SnapshotStore:
    """A finished snapshot of three partitions (one empty), as Parquet and as an SST image."""
    store = SnapshotStore(str(tmp_path / "snapshots"), CONFIG.name, "totals")
    image: dict[int, list[str]] = {}
    for partition in KEYS_PER_PARTITION:
        pairs = sorted(rows(partition).items())
        store.write_partition(SNAPSHOT_ID, partition, pairs, list(range(len(pairs))))
        writer = SortedSstWriter(store.image_location(SNAPSHOT_ID), f"p{partition}", RECORDS_PER_FILE)
        writer.put_many([key for key, _ in pairs], [value for _, value in pairs])
        image[partition] = [Path(file.path).name for file in writer.finish()]
    store.write_manifest(
        SnapshotManifest(
            app=CONFIG.name,
            store="totals",
            changelog_topic="app-totals-changelog",
            snapshot_id=SNAPSHOT_ID,
            created_at=time.time(),
            end_offsets={p: 10 * n + 7 for p, n in KEYS_PER_PARTITION.items()},
            key_counts=dict(KEYS_PER_PARTITION),
            sst_image=image,
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


def load(snapshots: SnapshotStore, state_dir: Path) -> dict[int, dict[bytes, bytes]]:
    """Load every partition from the latest snapshot; each store's content afterwards."""
    manifest = snapshots.latest()
    assert manifest is not None
    stores = open_stores(state_dir)
    try:
        reports = load_snapshot_partitions(stores, snapshots, manifest, dict(manifest.end_offsets), processes=2)
        for partition, store in stores.items():
            assert reports[partition].kind == "snapshot"
            assert reports[partition].records_applied == KEYS_PER_PARTITION[partition]
            assert store.changelog_offset == manifest.end_offsets[partition]
            assert not (store.path / BULK_LOAD_DIRECTORY).exists()
        return {partition: dict(store.items()) for partition, store in stores.items()}
    finally:
        for store in stores.values():
            store.close()


def image_files(snapshots: SnapshotStore) -> dict[Path, bytes]:
    directory = Path(snapshots.image_location(SNAPSHOT_ID).removeprefix("file://"))
    return {path: path.read_bytes() for path in directory.iterdir()}


@pytest.mark.parametrize("root", ["path", "uri"])
def test_partitions_load_from_the_image_without_reading_the_parquet_and_the_image_stays_intact(
    snapshots, tmp_path, root
):
    for parquet in Path(snapshots.snapshot_location(SNAPSHOT_ID)).glob("partition=*/*.parquet"):
        parquet.unlink()  # a load that reached for the Parquet rows would find none
    before = image_files(snapshots)
    if root == "uri":  # downloaded through pyarrow's filesystem, as from object storage
        snapshots = SnapshotStore(f"file://{snapshots.root}", CONFIG.name, "totals")

    first = load(snapshots, tmp_path / "first")
    second = load(snapshots, tmp_path / "second")

    assert first == second == {partition: rows(partition) for partition in KEYS_PER_PARTITION}
    assert image_files(snapshots) == before, "the snapshot's own files are neither moved nor changed"
    assert len(before) == 4 + 2, "partition 0's rows span 4 files, partition 1's 2"


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_an_image_that_cannot_be_read_falls_back_to_the_parquet_rows_with_a_warning(
    snapshots, tmp_path, caplog, damage
):
    manifest = snapshots.latest()
    assert manifest is not None
    damaged = Path(snapshots.image_location(SNAPSHOT_ID)) / manifest.sst_image[0][1]
    if damage == "missing":
        damaged.unlink()
    else:
        damaged.write_bytes(damaged.read_bytes()[:100])  # an upload cut short

    with caplog.at_level(logging.WARNING, logger="dagster_stateful.core.recovery.snapshot_load"):
        loaded = load(snapshots, tmp_path / "state")

    assert loaded == {partition: rows(partition) for partition in KEYS_PER_PARTITION}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "partition 0" in warnings[0] and SNAPSHOT_ID in warnings[0] and "Parquet rows instead" in warnings[0]
    if damage == "missing":
        assert str(damaged) in warnings[0], "the warning names the file"


def test_a_manifest_naming_a_file_outside_its_image_is_refused_and_the_parquet_rows_load(snapshots, tmp_path, caplog):
    manifest = snapshots.latest()
    assert manifest is not None
    snapshots.write_manifest(dataclasses.replace(manifest, sst_image={**manifest.sst_image, 1: ["../../x.sst"]}))

    with caplog.at_level(logging.WARNING, logger="dagster_stateful.core.recovery.snapshot_load"):
        loaded = load(snapshots, tmp_path / "state")

    assert loaded[1] == rows(1)
    assert any("'../../x.sst'" in r.getMessage() and "manifest is damaged" in r.getMessage() for r in caplog.records)


def test_the_manifest_keeps_its_image_and_older_manifests_have_none(snapshots):
    manifest = snapshots.latest()
    assert manifest is not None
    assert SnapshotManifest.from_json(manifest.to_json()) == manifest
    assert manifest.sst_image[2] == [], "an empty partition has an image of no files"
    written_before_images = json.loads(manifest.to_json())
    del written_before_images["sst_image"]

    older = SnapshotManifest.from_json(json.dumps(written_before_images))

    assert older.sst_image == {} and older.key_counts == manifest.key_counts
