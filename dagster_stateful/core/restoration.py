"""Restoring chosen store partitions outside a processing run, by the path the planner picks.

Owns `restore_partitions`: for each chosen partition of each store, plan the restore (changelog
replay, local snapshot load, or Spark-written SST files; see `restore_planner`), carry out the
bulk part, then let the ordinary recovery replay the changelog tail. Spark is reached only
through an `SstWriter` the caller passes in, so this module stays free of pyspark.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dagster_stateful.core.bulk_load import ingest_sst_files, load_snapshot_partition
from dagster_stateful.core.kafka import RESTORE_CONSUMER_CONFIG
from dagster_stateful.core.recovery import Restorer
from dagster_stateful.core.report import RestoreReport
from dagster_stateful.core.restore_planner import RestorePlan, plan_restore
from dagster_stateful.core.snapshots import SnapshotManifest, SnapshotStore
from dagster_stateful.core.store import StorePartition
from dagster_stateful.errors import ConfigurationError, StateLockedError

if TYPE_CHECKING:
    from dagster_stateful.core.app import App

SstWriter = Callable[[SnapshotStore, SnapshotManifest, list[int], str], dict[int, tuple[list[str], int]]]
"""(snapshots, manifest, partitions, output_dir) -> partition -> (SST files, keys); see spark.bulk_restore."""
METHODS = ("auto", "changelog", "snapshot", "spark")


@dataclass
class PartitionRestore:
    store: str
    partition: int
    plan: RestorePlan
    reports: list[RestoreReport] = field(default_factory=list)


def restore_partitions(app: App, partitions: Iterable[int], stores: Iterable[str] | None = None,
                       from_scratch: bool = False, skip_locked: bool = False, snapshot_root: str | None = None,
                       method: str = "auto", spark_cores: int = 0,
                       sst_writer: SstWriter | None = None) -> list[PartitionRestore]:
    """Bring the chosen partitions of the chosen stores (all by default) up to date.

    from_scratch: delete local state first. skip_locked: report partitions a running worker holds
    as "skipped" instead of failing (that worker restores them itself). method: "auto" (the
    planner decides) or a path to force.
    """
    if method not in METHODS:
        raise ConfigurationError(f"restore method {method!r} is not one of {METHODS}")
    if method == "spark" or spark_cores:
        if sst_writer is None:
            raise ConfigurationError("the Spark restore path needs an SST writer (a Spark session)")
    partitions = sorted(set(partitions))
    committed = app.kafka.committed_offsets(app.consumer_group, app.source, partitions)
    consumer = app.kafka.consumer({"group.id": f"{app.consumer_group}-restore", **RESTORE_CONSUMER_CONFIG})
    restorer = Restorer(consumer, app.listeners, app.restore_batch_size)
    activity = app.activity_lock()
    activity.hold_shared()
    try:
        results = []
        for store in stores or app.stores:
            snapshots = SnapshotStore(snapshot_root, app.name, store) if snapshot_root else None
            results += _restore_store(app, store, partitions, committed, restorer, snapshots, from_scratch,
                                      skip_locked, method, spark_cores, sst_writer)
        return results
    finally:
        activity.release()
        consumer.close()


def _restore_store(app: App, store: str, partitions: list[int], committed: dict[int, int | None],
                   restorer: Restorer, snapshots: SnapshotStore | None, from_scratch: bool, skip_locked: bool,
                   method: str, spark_cores: int, sst_writer: SstWriter | None) -> list[PartitionRestore]:
    marks = app.kafka.watermarks(app.changelog_topic(store), partitions)
    manifest = snapshots.latest() if snapshots else None
    opened, results = {}, []
    spark_files: dict[int, tuple[list[str], int]] = {}
    try:
        for partition in partitions:
            part = StorePartition(app.state_dir, app.name, store, partition, app.changelog_topic(store), app.source)
            try:
                part.open()
            except StateLockedError:
                if not skip_locked:
                    raise
                results.append(PartitionRestore(store, partition, RestorePlan(
                    partition, "skipped", "a running worker holds it and restores it itself", 0.0)))
                continue
            if from_scratch:
                part.wipe()
                part.open()
            opened[partition] = part
        plans = {p: _plan(p, part, marks[p], manifest, method, spark_cores) for p, part in opened.items()}
        spark_files = _spark_files(snapshots, manifest, [p for p, plan in plans.items() if plan.path == "spark"],
                                   sst_writer)
        for partition, part in opened.items():
            result = PartitionRestore(store, partition, plans[partition])
            if result.plan.path == "snapshot":
                result.reports.append(load_snapshot_partition(part, snapshots, manifest, marks[partition][1]))
            elif result.plan.path == "spark":
                files, keys = spark_files[partition]
                ingest_sst_files(part, files, manifest.end_offsets[partition])
                result.reports.append(RestoreReport(store, partition, "spark", 0, manifest.end_offsets[partition],
                                                    records_applied=keys))
            tail = restorer.restore(part, committed.get(partition))
            if tail is not None:
                result.reports.append(tail)
            results.append(result)
    finally:
        for part in opened.values():
            part.close()
        for directory in {str(Path(f).parent) for files, _ in spark_files.values() for f in files}:
            shutil.rmtree(directory, ignore_errors=True)  # what ingest did not move: failed task attempts
    return results


def _plan(partition: int, part: StorePartition, marks: tuple[int, int], manifest: SnapshotManifest | None,
          method: str, spark_cores: int) -> RestorePlan:
    low, high = marks
    planned = plan_restore(partition, part.changelog_offset, low, high, manifest,
                           spark_cores if method in ("auto", "spark") else 0)
    if method in ("auto", planned.path) or planned.path == "none":
        return planned
    if method == "changelog":
        return RestorePlan(partition, "changelog", f"forced by the run config (planner: {planned.reason})",
                           planned.estimated_seconds)
    if manifest is None or manifest.end_offsets.get(partition) is None:
        raise ConfigurationError(f"restore method {method!r} needs a snapshot with partition {partition}; "
                                 "build one first (the snapshot asset) or use 'changelog'")
    return RestorePlan(partition, method, f"forced by the run config (planner: {planned.reason})",
                       planned.estimated_seconds)


def _spark_files(snapshots: SnapshotStore | None, manifest: SnapshotManifest | None, partitions: list[int],
                 sst_writer: SstWriter | None) -> dict[int, tuple[list[str], int]]:
    if not partitions:
        return {}
    assert snapshots is not None and manifest is not None and sst_writer is not None
    output_dir = tempfile.mkdtemp(prefix="sst-")
    try:
        return sst_writer(snapshots, manifest, partitions, output_dir)
    except BaseException:
        shutil.rmtree(output_dir, ignore_errors=True)
        raise
