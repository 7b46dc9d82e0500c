"""Spark bulk restore: SST files for many store partitions written by Spark tasks, from a snapshot.

Owns `write_sst_files`, a plain function of a SparkSession. It sorts the snapshot's rows by
(partition, raw key bytes), and each task, with the core's `SortedSstWriter` inside the Python
worker (`mapInArrow`), writes the SST files of each Kafka partition it holds, starting new files
whenever the partition changes. Only the files that successful task attempts report back are
returned, never a directory listing, so a retried task's leftovers are never ingested. `output_dir`
must be visible to the process that ingests the files (a local directory with `local[*]`, a shared
mount on a cluster).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dagster_stateful.core.recovery.snapshots import SnapshotManifest, SnapshotStore

RESULT_SCHEMA = "partition int, path string, keys long"
_ARROW_RESULT_SCHEMA = pa.schema([("partition", pa.int32()), ("path", pa.string()), ("keys", pa.int64())])


def write_sst_files(
    spark: SparkSession, snapshots: SnapshotStore, manifest: SnapshotManifest, partitions: list[int], output_dir: str
) -> dict[int, tuple[list[str], int]]:
    """partition -> (SST file paths in key order, keys written)."""
    rows = (
        spark.read.parquet(snapshots.snapshot_location(manifest.snapshot_id))
        .where(F.col("partition").isin(partitions))
        .select("partition", "key", "value")
        .repartition(max(1, len(partitions)), "partition")
        .sortWithinPartitions("partition", "key")
    )
    written: dict[int, tuple[list[str], int]] = {p: ([], 0) for p in partitions}
    for row in rows.mapInArrow(_sst_task(output_dir), RESULT_SCHEMA).collect():
        files, keys = written[row.partition]
        written[row.partition] = ([*files, row.path], keys + row.keys)
    return written


def _sst_task(output_dir: str) -> Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]]:
    def write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
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
                    writer = SortedSstWriter(output_dir, f"p{partition}-{uuid.uuid4().hex}")
                assert writer is not None
                writer.put(key, value)
        close()
        yield pa.RecordBatch.from_pydict(
            {"partition": [f[0] for f in finished], "path": [f[1] for f in finished], "keys": [f[2] for f in finished]},
            schema=_ARROW_RESULT_SCHEMA,
        )

    return write
