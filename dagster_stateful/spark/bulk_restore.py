"""Spark bulk restore: SST files for many store partitions written by Spark tasks, from a snapshot.

Owns `write_sst_files`, a plain function of a SparkSession. It sorts the snapshot's rows by
(partition, raw key bytes), and each task, with the core's `SortedSstWriter` inside the Python
worker (`mapInArrow`), writes the SST files of each Kafka partition it holds, starting new files
whenever the partition changes, and stages them (`SstStaging`: in place for a plain path, uploaded
for a URI, so executors and the ingesting worker share no mount). Only the files that successful
task attempts report back are returned, never a directory listing, so a retried task's leftovers
are never ingested.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dagster_stateful.core.recovery.snapshot_format import SnapshotStore
from dagster_stateful.core.recovery.sst_staging import SstStaging, WrittenFiles

RESULT_SCHEMA = "partition int, path string, keys long"
_ARROW_RESULT_SCHEMA = pa.schema([("partition", pa.int32()), ("path", pa.string()), ("keys", pa.int64())])


def write_sst_files(
    spark: SparkSession, snapshots: SnapshotStore, snapshot_id: str, partitions: list[int], staging: str
) -> WrittenFiles:
    """partition -> (staged SST files in key order, keys written), staged under `staging`."""
    rows = (
        spark.read.parquet(snapshots.snapshot_location(snapshot_id))
        .where(F.col("partition").isin(partitions))
        .select("partition", "key", "value")
        .repartition(max(1, len(partitions)), "partition")
        .sortWithinPartitions("partition", "key")
    )
    written: WrittenFiles = {p: ([], 0) for p in partitions}
    for row in rows.mapInArrow(_sst_task(staging), RESULT_SCHEMA).collect():
        files, keys = written[row.partition]
        written[row.partition] = ([*files, row.path], keys + row.keys)
    return written


def _sst_task(staging_location: str) -> Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]]:
    def write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        staging = SstStaging(staging_location)
        with staging.task_directory() as directory:
            finished = _write_partitions(batches, directory)
            staged = staging.publish([path for _, path, _ in finished])
        yield pa.RecordBatch.from_pydict(
            {"partition": [f[0] for f in finished], "path": staged, "keys": [f[2] for f in finished]},
            schema=_ARROW_RESULT_SCHEMA,
        )

    return write


def _write_partitions(batches: Iterable[pa.RecordBatch], directory: Path) -> list[tuple[int, str, int]]:
    """(partition, file, records) of the SST files written from rows sorted by (partition, key)."""
    from dagster_stateful.core.state.rocksdb import SortedSstWriter

    finished: list[tuple[int, str, int]] = []
    writer: SortedSstWriter | None = None
    current: int | None = None

    def close() -> None:
        if writer is not None and current is not None:
            finished.extend((current, file.path, file.records) for file in writer.finish())

    for batch in batches:
        for partition, key, value in zip(
            batch.column(0).to_pylist(), batch.column(1).to_pylist(), batch.column(2).to_pylist(), strict=True
        ):
            if partition != current:
                close()
                current = partition
                writer = SortedSstWriter(directory, f"p{partition}-{uuid.uuid4().hex}")
            assert writer is not None
            writer.put(key, value)
    close()
    return finished
