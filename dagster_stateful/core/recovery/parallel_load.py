"""Loading several store partitions from a snapshot on several cores at once.

Owns `load_snapshot_partitions` and the `write_snapshot_files_parallel` it stands on. Writing SST
files means RocksDB called once per key, CPU-bound, so one process writes about a core's worth.
The partitions are split into groups of about equal key counts (from the Parquet footers), one per
process: this process writes the first group while child processes write the others. A child is
a fresh Python running this module's `main` (the engine's modules, pyarrow and rocksdict; no
Dagster): its job comes as JSON in its argument, the files it wrote go back as JSON on stdout. A
child dies with the process that started it, and a child that fails fails the whole load, naming
its partitions; the files are ingested only once every group is written.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dagster_stateful.core.monitoring.report import RestoreReport
from dagster_stateful.core.recovery.child_processes import balanced_groups, child_command, last_words
from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest, SnapshotStore
from dagster_stateful.core.recovery.snapshot_image import has_image
from dagster_stateful.core.recovery.snapshot_load import (
    BULK_LOAD_DIRECTORY,
    ingest_snapshot_files,
    load_snapshot_partition,
    snapshot_end,
    write_snapshot_files,
)
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.rocksdb import PartitionDatabase, SstFile
from dagster_stateful.errors import RecoveryError

log = logging.getLogger(__name__)


"""Characters of a failed child's error output carried into the error raised."""


def load_snapshot_partitions(
    stores: dict[int, StorePartition],
    snapshots: SnapshotStore,
    manifest: SnapshotManifest,
    changelog_highs: dict[int, int],
    processes: int | None = None,
) -> dict[int, RestoreReport]:
    """Replace each (open) store partition's state with the snapshot's, on up to `processes`
    processes (None: one per core); returns what was loaded, per partition. Partitions the snapshot
    carries as SST files (a copy and an ingest), stores that are not kept in RocksDB, and a single
    partition load in this process."""
    processes = processes or os.cpu_count() or 1
    in_files = {
        p: store
        for p, store in stores.items()
        if isinstance(store.db, PartitionDatabase) and not has_image(manifest, p)
    }
    if processes < 2 or len(in_files) < 2:
        in_files = {}
    reports = {
        partition: load_snapshot_partition(store, snapshots, manifest, changelog_highs[partition])
        for partition, store in stores.items()
        if partition not in in_files
    }
    if in_files:
        reports.update(_load_in_parallel(in_files, snapshots, manifest, changelog_highs, processes))
    return reports


def _load_in_parallel(
    stores: dict[int, StorePartition],
    snapshots: SnapshotStore,
    manifest: SnapshotManifest,
    changelog_highs: dict[int, int],
    processes: int,
) -> dict[int, RestoreReport]:
    ends = {partition: snapshot_end(store, manifest, changelog_highs[partition]) for partition, store in stores.items()}
    started = time.monotonic()
    for store in stores.values():
        store.start_fresh()
    jobs = [SnapshotFilesJob(partition, store.path / BULK_LOAD_DIRECTORY) for partition, store in stores.items()]
    try:
        written = write_snapshot_files_parallel(snapshots, manifest.snapshot_id, jobs, processes)
        return {
            partition: ingest_snapshot_files(store, manifest, written[partition], ends[partition], started)
            for partition, store in stores.items()
        }
    finally:
        for job in jobs:
            shutil.rmtree(job.directory, ignore_errors=True)


@dataclass(frozen=True)
class SnapshotFilesJob:
    """Write `partition` of the snapshot as SST files into `directory`."""

    partition: int
    directory: Path


def write_snapshot_files_parallel(
    snapshots: SnapshotStore, snapshot_id: str, jobs: list[SnapshotFilesJob], processes: int
) -> dict[int, list[SstFile]]:
    """Carry out the jobs on up to `processes` processes (this one included); returns each
    partition's SST files, in key order."""
    counts = snapshots.count_keys(snapshot_id, [job.partition for job in jobs])
    groups = balanced_groups(jobs, lambda job: counts[job.partition], processes)
    started = time.monotonic()
    children = [_start_child(snapshots, snapshot_id, group) for group in groups[1:]]
    try:
        written = {
            job.partition: write_snapshot_files(snapshots, snapshot_id, job.partition, job.directory)
            for job in groups[0]
        }
        for child, group in zip(children, groups[1:], strict=True):
            written.update(_child_result(child, snapshots, snapshot_id, group))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    log.info(
        "Wrote the SST files of store %r partitions %s from snapshot %s in %d process(es) in %.2f s",
        snapshots.store,
        sorted(written),
        snapshot_id,
        len(groups),
        time.monotonic() - started,
    )
    return written


def _start_child(snapshots: SnapshotStore, snapshot_id: str, group: list[SnapshotFilesJob]) -> subprocess.Popen[bytes]:
    job = {
        "root": snapshots.root,
        "app": snapshots.app,
        "store": snapshots.store,
        "snapshot_id": snapshot_id,
        "jobs": [[job.partition, str(job.directory)] for job in group],
    }
    return subprocess.Popen(
        [*child_command(__name__), json.dumps(job)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _child_result(
    child: subprocess.Popen[bytes], snapshots: SnapshotStore, snapshot_id: str, group: list[SnapshotFilesJob]
) -> dict[int, list[SstFile]]:
    output, errors = child.communicate()
    code = child.returncode
    partitions = [job.partition for job in group]
    if code != 0:
        raise RecoveryError(
            f"writing the SST files of store {snapshots.store!r} partitions {partitions} from snapshot "
            f"{snapshot_id} ({snapshots.snapshot_location(snapshot_id)}) failed in a child process (exit code "
            f"{code}): {last_words(errors)}. Nothing was "
            "ingested; restore again, or with method 'changelog' if the snapshot is damaged."
        )
    written = json.loads(output)
    return {int(partition): [SstFile(path, records) for path, records in files] for partition, files in written.items()}


def main() -> None:
    """A child's work: the job in `sys.argv[1]`, the files written on stdout, a failure on stderr."""
    job = json.loads(sys.argv[1])
    snapshots = SnapshotStore(job["root"], job["app"], job["store"])
    try:
        written = {
            partition: [
                [file.path, file.records]
                for file in write_snapshot_files(snapshots, job["snapshot_id"], partition, Path(directory))
            ]
            for partition, directory in job["jobs"]
        }
    except Exception as error:  # noqa: BLE001 - reported to the parent, which raises it with its context
        sys.stderr.write(f"{type(error).__name__}: {error}\n")
        sys.exit(1)
    sys.stdout.write(json.dumps(written))
