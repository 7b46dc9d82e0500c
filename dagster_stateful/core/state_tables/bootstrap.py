"""Bootstrapping a store: state computed in batch made the store's state, ready for the app's first worker.

Owns `bootstrap_arrow` (Flink's State Processor API "bootstrap", for Kafka state). In order, each
step only once the one before succeeded:
1. the table is encoded in full (`state_encoding`): nothing is written unless every row fits;
2. the store must hold no state (an empty changelog, no snapshot, no committed source offset) and
   the group no member; `replace=True` takes a store with state: the changelog's live keys the
   table lacks are tombstoned and this machine's copy of the store is cleared;
3. every row goes to the changelog with the `state_write` header (committed state wherever it lies),
   so that a changelog replay gives the state the snapshot holds;
4. a snapshot of the rows, ending at the changelog's end, is published (with its decoded table);
5. the group's source offsets are committed at the positions given, last: a bootstrap cut short
   commits nothing, and running it again with `replace=True` completes it.
The first worker then restores the store (from the snapshot or the changelog: both hold the same)
and processes only the messages after those positions.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.kafka.group_offsets import commit_group_offsets, offsets_for_time
from dagster_stateful.core.kafka.partitioner import Partitioner
from dagster_stateful.core.recovery.snapshot_format import SnapshotStore
from dagster_stateful.core.state.commit_metadata import carried_over
from dagster_stateful.core.state.decoding import RowDecoder
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state_tables.encoding import encode_state_table
from dagster_stateful.core.state_tables.table import write_snapshot_table
from dagster_stateful.core.state_tables.writes import (
    live_changelog_keys,
    publish_snapshot,
    refuse_group_members,
    write_changelog,
)
from dagster_stateful.errors import StateTableError

__all__ = ["BootstrapReport", "SourcePositions", "StoreTarget", "bootstrap_arrow"]

log = logging.getLogger(__name__)

SourcePositions = Mapping[int, int] | datetime | int
"""Where the app's processing starts: an offset per source partition, or a moment (a datetime, or
milliseconds since the epoch) whose offsets the broker's offsets-for-times finds."""
READ_TIMEOUT = 60.0


@dataclass(frozen=True)
class BootstrapReport:
    store: str
    snapshot_id: str
    rows_per_partition: dict[int, int]
    tombstones: int
    changelog_end_offsets: dict[int, int]
    source_positions: dict[int, int]

    @property
    def rows(self) -> int:
        return sum(self.rows_per_partition.values())


@dataclass(frozen=True)
class StoreTarget:
    """The store a table becomes the state of: its app's settings and clients, and its decoder."""

    config: AppConfig
    kafka: KafkaClients
    state: StateDirectory
    decoder: RowDecoder

    @property
    def store(self) -> str:
        return self.decoder.shape.name


def bootstrap_arrow(
    target: StoreTarget,
    table: pa.Table,
    source_positions: SourcePositions,
    snapshot_root: str,
    replace: bool = False,
    partitioner: Partitioner = "murmur2",
) -> BootstrapReport:
    """Make `table` (key, state_key, value, maybe partition) the state of the target's store, with
    processing resuming at `source_positions`; its changelog topic must exist (the app provisioned).
    See the module's docstring."""
    config, kafka, store = target.config, target.kafka, target.store
    source = config.task_topic
    partitions = kafka.partition_count(source)
    if partitions is None:
        raise StateTableError(f"source topic {source} of app {config.name!r} does not exist; create it first")
    positions = _positions(kafka, source, partitions, source_positions)
    encoded = encode_state_table(
        table, target.decoder, partitions, partitioner, f"the table bootstrapping store {store!r}"
    )
    changelog = config.changelog_topic(store)
    snapshots = SnapshotStore(snapshot_root, config.name, store)
    refuse_group_members(kafka, config, "bootstrapping")
    found = _existing_state(kafka, config, changelog, snapshots, partitions)
    if found and not replace:
        raise StateTableError(
            f"store {store!r} of app {config.name!r} already has state ({'; '.join(found)}); pass replace=True to "
            "replace it with the table"
        )
    tombstones: dict[int, set[bytes]] = {}
    if replace:
        live = live_changelog_keys(kafka, changelog, range(partitions))
        tombstones = {p: keys - encoded.keys(p) for p, keys in live.items()}
        target.state.clear([store], None)
    offsets = write_changelog(kafka, changelog, encoded.rows, tombstones)
    ends = {p: high for p, (_, high) in kafka.watermarks(changelog, range(partitions)).items()}
    manifest = publish_snapshot(snapshots, changelog, encoded.rows, offsets, ends, positions, "bootstrap")
    write_snapshot_table(target.decoder, snapshots, manifest)
    commit_group_offsets(kafka, config.consumer_group, source, positions, _kept_metadata(target, positions))
    report = BootstrapReport(
        store,
        manifest.snapshot_id,
        {p: len(rows) for p, rows in encoded.rows.items()},
        sum(len(keys) for keys in tombstones.values()),
        ends,
        positions,
    )
    log.info("Bootstrapped store %s of %s: %s", store, config.name, report)
    return report


def _kept_metadata(target: StoreTarget, positions: Mapping[int, int]) -> dict[int, str]:
    """Per partition, the metadata that keeps the app's other stores' stream times (and, where the
    offset stays, their changelog ends) through the bootstrap's offset commit."""
    config = target.config
    committed = target.kafka.committed(config.consumer_group, config.task_topic, sorted(positions))
    return {
        partition: carried_over(
            metadata, offset, positions[partition], target.store, f"{config.task_topic}[{partition}]"
        )
        for partition, (offset, metadata) in committed.items()
    }


def _positions(kafka: KafkaClients, source: str, partitions: int, given: SourcePositions) -> dict[int, int]:
    if isinstance(given, datetime | int):
        moment = int(given.timestamp() * 1000) if isinstance(given, datetime) else given
        return offsets_for_time(kafka, source, range(partitions), moment)
    marks = kafka.watermarks(source, range(partitions))
    if sorted(given) != list(range(partitions)):
        raise StateTableError(
            f"source_positions gives offsets for partitions {sorted(given)}; source topic {source} has partitions "
            f"0-{partitions - 1}: give one offset for each"
        )
    for partition, offset in sorted(given.items()):
        low, high = marks[partition]
        if not low <= offset <= high:
            raise StateTableError(
                f"source_positions gives offset {offset} for partition {partition} of {source}, which holds offsets "
                f"{low} to {high} (its end): give an offset in that range"
            )
    return dict(given)


def _existing_state(
    kafka: KafkaClients, config: AppConfig, changelog: str, snapshots: SnapshotStore, partitions: int
) -> list[str]:
    found = []
    records = sum(high for _, high in kafka.watermarks(changelog, range(partitions)).values())
    if records:
        found.append(f"changelog {changelog} has had {records} records")
    latest = snapshots.latest()
    if latest is not None:
        found.append(f"snapshot {latest.snapshot_id} under {snapshots.location}")
    committed = kafka.committed_offsets(config.consumer_group, config.task_topic, range(partitions))
    if any(offset is not None for offset in committed.values()):
        found.append(f"group {config.consumer_group!r} has committed offsets on {config.task_topic}")
    return found
