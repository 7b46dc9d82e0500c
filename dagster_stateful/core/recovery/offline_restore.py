"""Restoring chosen store partitions outside a processing run, by the path the planner picks.

Owns `restore_partitions` and the `RestoreRequest` it carries out: for each chosen partition of
each store, plan the restore (changelog replay, local snapshot load, or Spark-written SST files;
see `planner`), carry out the bulk part, then let the ordinary recovery replay the changelog tail. Spark is reached only
through an `SstWriter` the caller passes in, so this module stays free of pyspark.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from dagster_stateful.core.config import AppConfig, choice
from dagster_stateful.core.kafka.clients import RESTORE_CONSUMER_CONFIG, KafkaClients
from dagster_stateful.core.monitoring.listeners import Listeners
from dagster_stateful.core.monitoring.report import RestoreKind, RestoreReport
from dagster_stateful.core.recovery.parallel_load import load_snapshot_partitions
from dagster_stateful.core.recovery.parallel_replay import replay_partitions, replayable
from dagster_stateful.core.recovery.planner import RestoreMethod, RestorePath, RestorePlan, plan_restore
from dagster_stateful.core.recovery.restorer import Restorer
from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest, SnapshotStore
from dagster_stateful.core.recovery.snapshot_load import ingest_sst_files
from dagster_stateful.core.recovery.sst_staging import SstStaging, WrittenFiles
from dagster_stateful.core.state.commit_metadata import decode_commit_metadata
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.errors import ConfigurationError, StateLockedError

SstWriter = Callable[[SnapshotStore, SnapshotManifest, list[int], str], WrittenFiles]
"""(snapshots, manifest, partitions, staging location) -> partition -> (staged SST files, keys); see
spark.bulk_restore and `SstStaging`."""


class GroupPositions(NamedTuple):
    """Where the group's last commit left a store, per partition (`processing.commit_metadata`)."""

    committed: dict[int, int | None]
    """The committed source offset (None: never committed)."""
    ends: dict[int, int]
    """The store's changelog end the commit recorded, where it recorded one."""
    bare: set[int]
    """The partitions whose commit counts records without headers past that end as uncommitted."""


@dataclass
class PartitionRestore:
    store: str
    partition: int
    plan: RestorePlan
    reports: list[RestoreReport] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class RestoreRequest:
    """What to restore and how."""

    partitions: tuple[int, ...]
    stores: tuple[str, ...] | None = None
    """None: every store of the app."""
    from_scratch: bool = False
    skip_locked: bool = False
    snapshot_root: str | None = None
    method: RestoreMethod = RestoreMethod.AUTO
    spark_cores: int = 0
    sst_writer: SstWriter | None = None
    load_processes: int | None = None
    """Processes loading partitions at once, from a local snapshot or, for partitions with no local
    state, by replaying the whole changelog (None: one per core)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", choice(RestoreMethod, self.method, "restore method"))
        object.__setattr__(self, "partitions", tuple(sorted(set(self.partitions))))
        if self.stores is not None:
            object.__setattr__(self, "stores", tuple(self.stores))


def restore_partitions(
    config: AppConfig, kafka: KafkaClients, state: StateDirectory, listeners: Listeners, request: RestoreRequest
) -> list[PartitionRestore]:
    """Bring the chosen partitions of the chosen stores (all by default) up to date.

    from_scratch: delete local state first. skip_locked: report partitions a running worker holds
    as "skipped" instead of failing (that worker restores them itself). method: "auto" (the
    planner decides) or a path to force.
    """
    if (request.method is RestoreMethod.SPARK or request.spark_cores) and request.sst_writer is None:
        raise ConfigurationError("the Spark restore path needs an SST writer (a Spark session)")
    partitions = sorted(set(request.partitions))
    positions = kafka.committed(config.consumer_group, config.task_topic, partitions)
    committed = {partition: offset for partition, (offset, _) in positions.items()}
    decoded = {
        partition: decode_commit_metadata(metadata, offset, f"{config.task_topic}[{partition}]")
        for partition, (offset, metadata) in positions.items()
    }
    recorded = {partition: metadata.changelog_ends for partition, metadata in decoded.items()}
    bare = {partition for partition, metadata in decoded.items() if metadata.bare_uncommitted}
    consumer = kafka.consumer({"group.id": config.restore_group, **RESTORE_CONSUMER_CONFIG})
    restorer = Restorer(kafka, consumer, listeners, config.restore_batch_size, group=config.restore_group)
    activity = state.activity_lock()
    activity.hold_shared()
    try:
        results = []
        for store in request.stores or config.stores:
            snapshots = SnapshotStore(request.snapshot_root, config.name, store) if request.snapshot_root else None
            ends = {partition: by_store[store] for partition, by_store in recorded.items() if store in by_store}
            positions_of_store = GroupPositions(committed, ends, bare)
            results += _restore_store(kafka, state, store, partitions, positions_of_store, restorer, snapshots, request)
        return results
    finally:
        activity.release()
        consumer.close()


def _restore_store(
    kafka: KafkaClients,
    state: StateDirectory,
    store: str,
    partitions: list[int],
    group_positions: GroupPositions,
    restorer: Restorer,
    snapshots: SnapshotStore | None,
    request: RestoreRequest,
) -> list[PartitionRestore]:
    """group_positions: where the group's last commit left the store (`commit_metadata`)."""
    committed, ends, bare = group_positions
    marks = kafka.watermarks(state.config.changelog_topic(store), partitions, committed=True)
    manifest = snapshots.latest() if snapshots else None
    opened: dict[int, StorePartition] = {}
    results = []
    spark_files: WrittenFiles = {}
    cleanups: list[Callable[[], None]] = []
    try:
        for partition in partitions:
            part = state.partition(store, partition)
            try:
                part.open(lock_timeout=0 if request.skip_locked else None)
            except StateLockedError:
                if not request.skip_locked:
                    raise
                results.append(
                    PartitionRestore(
                        store,
                        partition,
                        RestorePlan(
                            partition, RestorePath.SKIPPED, "a running worker holds it and restores it itself", 0.0
                        ),
                    )
                )
                continue
            if request.from_scratch:
                part.start_fresh()
            opened[partition] = part
        plans = {
            p: _plan(p, part, marks[p], manifest, request.method, request.spark_cores) for p, part in opened.items()
        }
        spark_partitions = [p for p, plan in plans.items() if plan.path is RestorePath.SPARK]
        spark_files = _spark_files(snapshots, manifest, spark_partitions, request.sst_writer, cleanups)
        loaded = _snapshot_loads(opened, plans, snapshots, manifest, marks, request.load_processes)
        loaded |= _changelog_replays(kafka, restorer, opened, plans, group_positions, marks, request.load_processes)
        for partition, part in opened.items():
            result = PartitionRestore(store, partition, plans[partition])
            if partition in loaded:
                result.reports.append(loaded[partition])
            elif result.plan.path is RestorePath.SPARK:
                assert manifest is not None
                files, keys = spark_files[partition]
                ingest_sst_files(part, files, manifest.end_offsets[partition])
                result.reports.append(
                    RestoreReport(
                        store, partition, RestoreKind.SPARK, 0, manifest.end_offsets[partition], records_applied=keys
                    )
                )
            tail = restorer.restore(part, committed.get(partition), ends.get(partition), partition in bare)
            if tail is not None:
                result.reports.append(tail)
            results.append(result)
    finally:
        for part in opened.values():
            part.close()
        for cleanup in cleanups:
            cleanup()  # what ingest did not move: failed task attempts, unused downloads
    return results


def _snapshot_loads(
    opened: dict[int, StorePartition],
    plans: dict[int, RestorePlan],
    snapshots: SnapshotStore | None,
    manifest: SnapshotManifest | None,
    marks: dict[int, tuple[int, int]],
    processes: int | None,
) -> dict[int, RestoreReport]:
    """Load the partitions planned from the local snapshot, in parallel."""
    chosen = {p: part for p, part in opened.items() if plans[p].path is RestorePath.SNAPSHOT}
    if not chosen:
        return {}
    assert snapshots is not None and manifest is not None
    highs = {p: marks[p][1] for p in chosen}
    return load_snapshot_partitions(chosen, snapshots, manifest, highs, processes)


def _changelog_replays(
    kafka: KafkaClients,
    restorer: Restorer,
    opened: dict[int, StorePartition],
    plans: dict[int, RestorePlan],
    group_positions: GroupPositions,
    marks: dict[int, tuple[int, int]],
    processes: int | None,
) -> dict[int, RestoreReport]:
    """Replay the whole changelog of the partitions with no local state, in parallel; the others (and
    a single one) replay in `restorer`'s ordinary way."""
    chosen = {p: part for p, part in opened.items() if plans[p].path is RestorePath.CHANGELOG and replayable(part)}
    processes = processes or os.cpu_count() or 1
    if len(chosen) < 2 or processes < 2:
        return {}
    committed, ends, bare = group_positions
    group, batch_size = restorer.group, restorer.batch_size
    return replay_partitions(
        kafka, group, chosen, committed, marks, processes, batch_size, committed_ends=ends, bare_uncommitted=bare
    )


def _plan(
    partition: int,
    part: StorePartition,
    marks: tuple[int, int],
    manifest: SnapshotManifest | None,
    method: RestoreMethod,
    spark_cores: int,
) -> RestorePlan:
    low, high = marks
    planned = plan_restore(
        partition,
        part.changelog_offset,
        low,
        high,
        manifest,
        spark_cores if method in (RestoreMethod.AUTO, RestoreMethod.SPARK) else 0,
    )
    if method is RestoreMethod.AUTO or planned.path in (RestorePath(method.value), RestorePath.NONE):
        return planned
    forced = RestorePath(method.value)
    if forced is not RestorePath.CHANGELOG and (manifest is None or manifest.end_offsets.get(partition) is None):
        raise ConfigurationError(
            f"restore method {method.value!r} needs a snapshot with partition {partition}; "
            "build one first (the snapshot asset) or use 'changelog'"
        )
    return RestorePlan(
        partition, forced, f"forced by the run config (planner: {planned.reason})", planned.estimated_seconds
    )


def _spark_files(
    snapshots: SnapshotStore | None,
    manifest: SnapshotManifest | None,
    partitions: list[int],
    sst_writer: SstWriter | None,
    cleanups: list[Callable[[], None]],
) -> WrittenFiles:
    """Have the writer stage the partitions' SST files under the snapshot, then fetch them here."""
    if not partitions:
        return {}
    assert snapshots is not None and manifest is not None and sst_writer is not None
    staging = SstStaging(snapshots.staging_location(manifest.snapshot_id, uuid.uuid4().hex))
    cleanups.append(staging.remove)
    written = sst_writer(snapshots, manifest, partitions, staging.location)
    scratch = Path(tempfile.mkdtemp(prefix="sst-fetched-"))
    cleanups.append(lambda: shutil.rmtree(scratch, ignore_errors=True))
    return staging.fetch(written, scratch)
