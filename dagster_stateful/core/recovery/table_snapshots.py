"""Snapshots of a partitioned table's store: where they live, where each partition is cut, and loading one.

Owns `table_snapshots` (the table's `SnapshotStore`, under `<snapshot root>/<app>/tables/<table>`,
as a worker keeps the table under `<state dir>/<app>/tables/<table>`), `table_cut` and
`restore_table_partitions`. A table's topic is its changelog, and its store holds the latest value
of each key applied so far. A snapshot of a partition is cut at the position the group's last
commit of the joining stream's partition recorded (`commit_metadata.table_entry`): the table as
that commit left it, where a worker taking the partition resumes. A partition no commit has
recorded a position for is cut at the topic's beginning (its snapshot holds no rows), as Kafka
Streams restores a source table whose topic has no committed offset to nothing: a worker applies
those records from the beginning while processing, in timestamp order with the stream's. A position
past the topic's end (a recreated topic) is cut at the end, with a warning, as a worker reads it.
A versioned table is refused: its store keeps every version of a key for its history, which a
compacted topic cannot give back once compaction ran.

Loading a partition replaces the local copy's rows with the snapshot's (its SST image when it has
one, else its Parquet rows written as SST files) and records the snapshot's end as the offset of
the next record to apply; a worker then reads the table on from there up to its commit's position.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.monitoring.report import RestoreKind, RestoreReport
from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest, SnapshotStore
from dagster_stateful.core.recovery.snapshot_image import fetch_image, has_image
from dagster_stateful.core.recovery.snapshot_load import BULK_LOAD_DIRECTORY, write_snapshot_files
from dagster_stateful.core.state.commit_metadata import decode_commit_metadata, table_entry
from dagster_stateful.core.state.directory import TABLES_DIR
from dagster_stateful.core.state.rocksdb import PartitionDatabase
from dagster_stateful.errors import ConfigurationError, RecoveryError, StateStoreError, TopicMissingError

log = logging.getLogger(__name__)


def table_snapshots(root: str | None, app: str, table: str, versioned: bool = False) -> SnapshotStore:
    """The snapshots of partitioned table `table` of `app` under `root`; `ConfigurationError` without
    a root, or for a versioned table (see the module)."""
    if versioned:
        raise ConfigurationError(
            f"table {table!r} of app {app!r} is versioned (history=): its store keeps every version of a key for "
            "its history, which a snapshot of its compacted topic cannot give back, so it has no snapshots. Its "
            "workers restore it by reading the topic; declare it without history= to snapshot it"
        )
    if not root:
        raise ConfigurationError(
            f"no snapshot location for table {table!r} of app {app!r}: pass snapshot_root= (the `state_store` "
            "resource's snapshot_root) or give the App one"
        )
    return SnapshotStore(root, app, table, directory=f"{TABLES_DIR}/{table}")


@dataclass(frozen=True)
class TableCut:
    """Where a table's snapshot ends in each partition of its topic, and why."""

    ends: dict[int, int]
    """Per partition: the offset the snapshot holds the table up to (exclusive)."""
    positions: dict[int, int | None]
    """Per partition: the position the group's last commit recorded (None: none recorded)."""
    topic_ends: dict[int, int]
    """Per partition: where the topic ends for a `read_committed` reader, when the cut was read."""


def table_cut(kafka: KafkaClients, consumer_group: str, stream_topic: str, table: str, topic: str) -> TableCut:
    """Where the next snapshot of `table` (whose records are in `topic`) ends in each partition: at the
    position the group's last commit of `stream_topic`'s partition of the same number recorded."""
    count = kafka.partition_count(topic)
    if not count:
        raise TopicMissingError(
            f"topic {topic!r} of table {table!r} does not exist, so it has nothing to snapshot: create it (its "
            "producers write it) or check the table's declaration"
        )
    partitions = range(count)
    committed = kafka.committed(consumer_group, stream_topic, partitions)
    positions = {
        partition: decode_commit_metadata(metadata, offset, f"{stream_topic}[{partition}]").stream_times.get(
            table_entry(table)
        )
        for partition, (offset, metadata) in committed.items()
    }
    marks = kafka.watermarks(topic, partitions, committed=True)
    ends = {
        partition: _cut(topic, partition, positions.get(partition), low, end) for partition, (low, end) in marks.items()
    }
    return TableCut(ends, {p: positions.get(p) for p in partitions}, {p: end for p, (_, end) in marks.items()})


def _cut(topic: str, partition: int, position: int | None, low: int, end: int) -> int:
    if position is None:
        return low
    if position > end:
        log.warning(
            "%s[%d]: the committed table position %d is past the topic's end %d (the topic was recreated?); the "
            "snapshot ends at the end, where workers read the table to",
            topic,
            partition,
            position,
            end,
        )
        return end
    return position


class TableCopy(Protocol):
    """A partitioned table's partition kept on this machine, as loading needs it (the worker's
    `TablePartition` is one)."""

    partition: int
    path: Path
    database: PartitionDatabase | None
    applied: int
    newest: int

    def open(self, lock_seconds: float) -> tuple[int | None, int]: ...
    def wipe(self) -> None: ...
    def start_at(self, offset: int, newest: int) -> None: ...
    def commit(self) -> None: ...
    def close(self) -> None: ...


def restore_table_partitions(
    copy_of: Callable[[int], TableCopy],
    snapshots: SnapshotStore,
    kafka: KafkaClients,
    partitions: Iterable[int] | None,
    lock_seconds: float,
) -> list[RestoreReport]:
    """Load `partitions` (all the latest snapshot holds, by default) of the table whose snapshots
    `snapshots` holds from its latest one into the local copies `copy_of` gives; `RecoveryError`
    when there is no snapshot, or it cannot be loaded."""
    manifest = snapshots.latest()
    if manifest is None:
        raise RecoveryError(
            f"table {snapshots.store!r} has no finished snapshot under {snapshots.location}: materialize its "
            "snapshot asset (or run the compaction job) first, or let the workers read the table's topic"
        )
    chosen = sorted(manifest.end_offsets if partitions is None else set(partitions))
    marks = kafka.watermarks(manifest.changelog_topic, chosen, committed=True)
    return [load_table_partition(copy_of(p), snapshots, manifest, marks[p][1], lock_seconds) for p in chosen]


def load_table_partition(
    copy: TableCopy, snapshots: SnapshotStore, manifest: SnapshotManifest, topic_end: int, lock_seconds: float
) -> RestoreReport:
    """Replace the local copy's rows with the snapshot's and record its end as the next record to apply."""
    end = _snapshot_end(manifest, copy.partition, topic_end)
    started = time.monotonic()
    copy.open(lock_seconds)
    try:
        copy.wipe()
        assert copy.database is not None, "open"
        count = _ingest(copy.database, snapshots, manifest, copy.partition, copy.path / BULK_LOAD_DIRECTORY)
        copy.start_at(0, copy.newest)
        copy.applied = end  # every record below the snapshot's end is in its rows
        copy.commit()  # records the position, in the database's metadata, as a worker's commit does
    finally:
        copy.close()
    seconds = time.monotonic() - started
    log.info(
        "Loaded table %r partition %d from snapshot %s: %d keys, up to offset %d, in %.2f s",
        snapshots.store,
        copy.partition,
        manifest.snapshot_id,
        count,
        end,
        seconds,
    )
    return RestoreReport(
        snapshots.store, copy.partition, RestoreKind.SNAPSHOT, 0, end, records_applied=count, seconds=seconds
    )


def _snapshot_end(manifest: SnapshotManifest, partition: int, topic_end: int) -> int:
    end = manifest.end_offsets.get(partition)
    if end is None:
        raise RecoveryError(
            f"snapshot {manifest.snapshot_id} of table {manifest.store!r} has no partition {partition}; take a new "
            "snapshot, or let the workers read the table's topic"
        )
    if end > topic_end:
        raise RecoveryError(
            f"snapshot {manifest.snapshot_id} covers {manifest.changelog_topic}[{partition}] up to offset {end}, "
            f"beyond the topic's end {topic_end}: the topic was recreated after the snapshot. Let the workers read "
            "the table's topic, or take a new snapshot."
        )
    return end


def _ingest(
    database: PartitionDatabase, snapshots: SnapshotStore, manifest: SnapshotManifest, partition: int, scratch: Path
) -> int:
    """Ingest the snapshot partition's rows into the empty `database`; returns how many."""
    count = manifest.key_counts.get(partition, 0)
    if not count:
        return 0
    try:
        if has_image(manifest, partition):
            try:
                database.ingest_files(fetch_image(snapshots, manifest, partition, scratch))
                return count
            except (RecoveryError, StateStoreError) as error:
                log.warning(
                    "Table %r partition %d: the SST image of snapshot %s cannot be loaded (%s); loading its Parquet "
                    "rows instead",
                    snapshots.store,
                    partition,
                    manifest.snapshot_id,
                    error,
                )
                shutil.rmtree(scratch, ignore_errors=True)
        files = write_snapshot_files(snapshots, manifest.snapshot_id, partition, scratch)
        database.ingest_files([file.path for file in files])
        return sum(file.records for file in files)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
