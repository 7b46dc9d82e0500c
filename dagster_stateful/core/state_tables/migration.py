"""Migrating a store's state between versions of an app: new rows, written where every restore finds them.

Owns `migrate_snapshot` (Flink's State Processor API "transform", for Kafka state). Given the
store's latest snapshot and its rows transformed (a table laid out as `state_table` reads them):
1. the app's workers must be stopped, and the snapshot must reach the changelog's end: a replay
   after loading it would otherwise apply records of the old shape over the new state;
2. the new rows are encoded in full, each on its snapshot partition (`state_encoding`);
3. the changed keys go to the changelog, as new values and as tombstones for the keys the new rows
   lack, so that a replay of the changelog alone gives the new state too;
4. a new snapshot of the new rows (at the same source offsets, up to the changelog's new end) is
   published with its decoded table: the next restore, of any machine, loads it or replays to it.
The partition's stream time (an expiring store's) is carried over unchanged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pyarrow as pa

from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest, SnapshotStore
from dagster_stateful.core.state.keys import is_reserved
from dagster_stateful.core.state_tables.bootstrap import StoreTarget
from dagster_stateful.core.state_tables.encoding import encode_state_table
from dagster_stateful.core.state_tables.table import write_snapshot_table
from dagster_stateful.core.state_tables.writes import publish_snapshot, refuse_group_members, write_changelog
from dagster_stateful.errors import StateTableError

__all__ = ["MigrationReport", "migrate_snapshot"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MigrationReport:
    store: str
    snapshot_id: str
    previous_snapshot_id: str
    rows: int
    changed: int
    """Rows whose stored value the migration changed or added (each written to the changelog)."""
    tombstones: int
    changelog_end_offsets: dict[int, int]


def migrate_snapshot(
    target: StoreTarget, snapshots: SnapshotStore, manifest: SnapshotManifest, table: pa.Table, json_text: bool
) -> MigrationReport:
    """Make `table` (the rows of `manifest`'s snapshot, transformed) the store's state; see the module's docstring."""
    config, kafka, store = target.config, target.kafka, target.store
    changelog = config.changelog_topic(store)
    partitions = sorted(manifest.key_counts)
    refuse_group_members(kafka, config, "migrating")
    ends = {p: high for p, (_, high) in kafka.watermarks(changelog, partitions, committed=True).items()}
    behind = {p: (manifest.end_offsets.get(p), end) for p, end in ends.items() if manifest.end_offsets.get(p) != end}
    if behind:
        raise StateTableError(
            f"snapshot {manifest.snapshot_id} of store {store!r} does not reach the end of changelog {changelog} "
            f"(partition: snapshot end/changelog end {behind}); with the app's workers stopped, take a new snapshot, "
            "then migrate it"
        )
    what = f"the migrated table of store {store!r}"
    encoded = encode_state_table(table, target.decoder, len(partitions), None, what, json_text)
    changed: dict[int, list[tuple[bytes, bytes]]] = {}
    tombstones: dict[int, set[bytes]] = {}
    rows: dict[int, list[tuple[bytes, bytes]]] = {}
    for partition in partitions:
        old = _stored(snapshots, manifest.snapshot_id, partition)
        new = dict(encoded.rows.get(partition, ()))
        new.update((key, value) for key, value in old.items() if is_reserved(key))  # stream time, timers
        changed[partition] = [(key, value) for key, value in sorted(new.items()) if old.get(key) != value]
        tombstones[partition] = set(old) - set(new)
        rows[partition] = sorted(new.items())
    written = write_changelog(kafka, changelog, changed, tombstones)
    new_ends = {p: high for p, (_, high) in kafka.watermarks(changelog, partitions, committed=True).items()}
    offsets = _offsets(snapshots, manifest.snapshot_id, rows, changed, written)
    committed = {int(p): o for p, o in manifest.extra.get("committed_source_offsets", {}).items()}
    migrated = publish_snapshot(snapshots, changelog, rows, offsets, new_ends, committed, "migration")
    write_snapshot_table(target.decoder, snapshots, migrated)
    report = MigrationReport(
        store,
        migrated.snapshot_id,
        manifest.snapshot_id,
        sum(len(kept) for kept in rows.values()),
        sum(len(kept) for kept in changed.values()),
        sum(len(keys) for keys in tombstones.values()),
        new_ends,
    )
    log.info("Migrated store %s of %s: %s", store, config.name, report)
    return report


def _stored(snapshots: SnapshotStore, snapshot_id: str, partition: int) -> dict[bytes, bytes]:
    stored: dict[bytes, bytes] = {}
    for keys, values in snapshots.read_partition(snapshot_id, partition):
        stored.update(zip(keys, values, strict=True))
    return stored


def _offsets(
    snapshots: SnapshotStore,
    snapshot_id: str,
    rows: dict[int, list[tuple[bytes, bytes]]],
    changed: dict[int, list[tuple[bytes, bytes]]],
    written: dict[int, list[int]],
) -> dict[int, list[int]]:
    """Each new row's changelog offset: where the migration wrote it, else where the old snapshot had it."""
    offsets = {}
    for partition, kept in rows.items():
        at = snapshots.read_offsets(snapshot_id, partition)
        at.update({key: offset for (key, _), offset in zip(changed[partition], written[partition], strict=True)})
        offsets[partition] = [at[key] for key, _ in kept]
    return offsets
