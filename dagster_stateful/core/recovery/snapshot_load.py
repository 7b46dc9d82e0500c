"""Bulk loading a store partition from a snapshot: sorted SST files ingested into a fresh database.

Owns `load_snapshot_partition`: the partition's local state is replaced by the snapshot's rows
(its SST image when it has one, ingested as is; otherwise its Parquet rows, read with pyarrow,
already sorted by key, so writing SST files is a straight copy; a damaged image falls back to
the Parquet rows with a warning), its stored
changelog offset is set to the snapshot's end offset, and the ordinary recovery then replays only
the changelog tail written after the snapshot; `load_snapshot_if_faster` does so when the
planner says it beats the replay (a worker's own restores). Also `ingest_sst_files`, for SST files
another process (a Spark task) wrote.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from dagster_stateful.core.monitoring.report import RestoreKind, RestoreReport
from dagster_stateful.core.recovery.planner import RestorePath, plan_restore
from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest, SnapshotStore
from dagster_stateful.core.recovery.snapshot_image import fetch_image, has_image
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.rocksdb import PartitionDatabase, SortedSstWriter, SstFile
from dagster_stateful.errors import RecoveryError, StateStoreError

log = logging.getLogger(__name__)

BULK_LOAD_DIRECTORY = ".bulk-load"
"""Where, inside a store partition's directory, its SST files are written before they are ingested."""


def load_snapshot_partition(
    store: StorePartition, snapshots: SnapshotStore, manifest: SnapshotManifest, changelog_high: int
) -> RestoreReport:
    """Replace the (open) store partition's state with the snapshot's; returns what was loaded."""
    partition = store.partition
    end = snapshot_end(store, manifest, changelog_high)
    started = time.monotonic()
    store.start_fresh()
    scratch = store.path / BULK_LOAD_DIRECTORY
    try:
        if isinstance(store.db, PartitionDatabase):
            if has_image(manifest, partition) and _ingest_image(store, snapshots, manifest, scratch):
                return _loaded(store, manifest, end, manifest.key_counts.get(partition, 0), started)
            files = write_snapshot_files(snapshots, manifest.snapshot_id, partition, scratch)
            return ingest_snapshot_files(store, manifest, files, end, started)
        count = store.db.ingest_sorted(_pairs(snapshots.read_partition(manifest.snapshot_id, partition)), scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return _loaded(store, manifest, end, count, started)


def _ingest_image(store: StorePartition, snapshots: SnapshotStore, manifest: SnapshotManifest, scratch: Path) -> bool:
    """Ingest the partition's SST image into the (empty) store; False, with the store emptied again and
    a warning saying why, when the image cannot be read or ingested."""
    try:
        store.db.ingest_files(fetch_image(snapshots, manifest, store.partition, scratch))
        return True
    except (RecoveryError, StateStoreError) as error:
        log.warning(
            "Store %r partition %d: the SST image of snapshot %s cannot be loaded (%s); loading the snapshot's "
            "Parquet rows instead",
            store.store,
            store.partition,
            manifest.snapshot_id,
            error,
        )
    shutil.rmtree(scratch, ignore_errors=True)
    store.start_fresh()
    return False


def ingest_snapshot_files(
    store: StorePartition, manifest: SnapshotManifest, files: list[SstFile], end: int, started: float
) -> RestoreReport:
    """Ingest a snapshot partition's SST files into the (freshly emptied) store partition and record
    the changelog offset `end` it reaches; `started`: when the load began (monotonic)."""
    store.db.ingest_files([file.path for file in files])
    return _loaded(store, manifest, end, sum(file.records for file in files), started)


def _loaded(store: StorePartition, manifest: SnapshotManifest, end: int, count: int, started: float) -> RestoreReport:
    store.finish_restore(end, None)
    seconds = time.monotonic() - started
    log.info(
        "Loaded store %r partition %d from snapshot %s: %d keys in %.2f s",
        store.store,
        store.partition,
        manifest.snapshot_id,
        count,
        seconds,
    )
    return RestoreReport(
        store.store, store.partition, RestoreKind.SNAPSHOT, 0, end, records_applied=count, seconds=seconds
    )


def write_snapshot_files(snapshots: SnapshotStore, snapshot_id: str, partition: int, directory: Path) -> list[SstFile]:
    """A partition of the snapshot as sorted SST files in `directory`, ready to ingest."""
    writer = SortedSstWriter(directory, f"snapshot-{partition}")
    for keys, values in snapshots.read_partition(snapshot_id, partition):
        writer.put_many(keys, values)
    return writer.finish()


def load_snapshot_if_faster(
    store: StorePartition, snapshots: SnapshotStore, changelog_low: int, changelog_high: int
) -> RestoreReport | None:
    """Load the latest snapshot into the (open) store partition when the planner says that loading it
    and replaying the tail after it is faster than replaying the changelog; None otherwise."""
    manifest = snapshots.latest()
    plan = plan_restore(store.partition, store.changelog_offset, changelog_low, changelog_high, manifest)
    if plan.path is not RestorePath.SNAPSHOT or manifest is None:
        return None
    log.info("Store %r partition %d: %s", store.store, store.partition, plan.reason)
    return load_snapshot_partition(store, snapshots, manifest, changelog_high)


def ingest_sst_files(store: StorePartition, files: Iterable[str], changelog_offset: int) -> None:
    """Replace the (open) store partition's state with SST files written elsewhere (files are moved)."""
    store.start_fresh()
    store.db.ingest_files(list(files))
    store.finish_restore(changelog_offset, None)


def snapshot_end(store: StorePartition, manifest: SnapshotManifest, changelog_high: int) -> int:
    """The changelog offset the snapshot covers the partition up to; raises `RecoveryError` when it has
    no such partition, or when it covers more than the changelog holds (the topic was recreated)."""
    end = manifest.end_offsets.get(store.partition)
    if end is None:
        raise RecoveryError(
            f"snapshot {manifest.snapshot_id} of store {manifest.store!r} has no partition "
            f"{store.partition}; take a new snapshot or restore from the changelog"
        )
    if end > changelog_high:
        raise RecoveryError(
            f"snapshot {manifest.snapshot_id} covers {manifest.changelog_topic}[{store.partition}] up to offset {end}, "
            f"beyond the changelog's end {changelog_high}: the changelog was recreated after the snapshot. Restore "
            "from the changelog instead, or take a new snapshot."
        )
    return end


def _pairs(batches: Iterator[tuple[list[bytes], list[bytes]]]) -> Iterator[tuple[bytes, bytes]]:
    for keys, values in batches:
        yield from zip(keys, values, strict=False)
