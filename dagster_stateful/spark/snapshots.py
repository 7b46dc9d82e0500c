"""The compaction snapshot job: a changelog topic folded into the store's next snapshot, with Spark.

Owns `build_snapshot`, a plain function of a SparkSession. It reads the changelog with Spark's
Kafka source from the previous snapshot's end offsets (or the beginning) to the given end
offsets, keeps the latest value per key and partition (by offset), lets those rows replace the
previous snapshot's (a tombstone removes the key), drops tombstones, and writes Parquet, one
directory per Kafka partition with rows sorted by the raw key bytes. The manifest is written
last; older snapshots are pruned to `keep`. Runs unchanged on `local[*]` or a cluster.
"""

from __future__ import annotations

import json
import logging
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dagster_stateful.core.recovery.snapshots import SnapshotManifest, SnapshotStore

log = logging.getLogger(__name__)


def build_snapshot(
    spark: SparkSession,
    kafka_options: dict[str, str],
    changelog_topic: str,
    end_offsets: dict[int, int],
    snapshots: SnapshotStore,
    keep: int = 3,
) -> SnapshotManifest:
    """Fold `changelog_topic` up to `end_offsets` (partition -> exclusive end) into a new snapshot.

    kafka_options: `kafka.*` options of Spark's Kafka source (`kafka.bootstrap.servers`, security).
    """
    previous = snapshots.latest()
    start_offsets = {p: (previous.end_offsets.get(p, 0) if previous else 0) for p in end_offsets}
    started = time.monotonic()
    changes = _latest_changes(spark, kafka_options, changelog_topic, start_offsets, end_offsets)
    if previous is not None:
        kept = spark.read.parquet(snapshots.snapshot_location(previous.snapshot_id)).select(
            "partition", "key", "value", "offset"
        )
        rows = kept.join(changes.select("partition", "key"), ["partition", "key"], "left_anti").unionByName(changes)
    else:
        rows = changes
    snapshot_id = snapshots.new_snapshot_id()
    (
        rows.where(F.col("value").isNotNull())
        .repartition("partition")  # every row of a Kafka partition in one task: one sorted file per partition
        .sortWithinPartitions("partition", "key")
        .write.partitionBy("partition")
        .parquet(snapshots.snapshot_location(snapshot_id))
    )
    manifest = SnapshotManifest(
        app=snapshots.app,
        store=snapshots.store,
        changelog_topic=changelog_topic,
        snapshot_id=snapshot_id,
        created_at=time.time(),
        end_offsets=dict(end_offsets),
        key_counts=snapshots.count_keys(snapshot_id, sorted(end_offsets)),
        previous=previous.snapshot_id if previous else None,
        extra={
            "records_read_upper_bound": sum(end_offsets[p] - start_offsets[p] for p in end_offsets),
            "seconds": round(time.monotonic() - started, 3),
        },
    )
    snapshots.write_manifest(manifest)
    pruned = snapshots.prune(keep)
    log.info(
        "Snapshot %s of %s: %d keys up to %s (pruned %s)",
        snapshot_id,
        changelog_topic,
        sum(manifest.key_counts.values()),
        end_offsets,
        pruned,
    )
    return manifest


def _latest_changes(
    spark: SparkSession, kafka_options: dict[str, str], topic: str, start: dict[int, int], end: dict[int, int]
) -> DataFrame:
    """The last record per (partition, key) in the offset ranges; tombstones keep a null value."""
    partitions = [p for p in sorted(end) if end[p] > start[p]]
    if not partitions:
        return spark.createDataFrame([], "partition int, key binary, value binary, offset long")
    reader = spark.read.format("kafka")
    for name, value in kafka_options.items():
        reader = reader.option(name, value)
    records = (
        reader.option("assign", json.dumps({topic: partitions}))
        .option("startingOffsets", json.dumps({topic: {str(p): start[p] for p in partitions}}))
        .option("endingOffsets", json.dumps({topic: {str(p): end[p] for p in partitions}}))
        .option("failOnDataLoss", "false")  # compaction leaves gaps in the offsets
        .load()
    )
    latest = records.groupBy("partition", "key").agg(F.max_by(F.struct("value", "offset"), "offset").alias("last"))
    return latest.select(
        F.col("partition").cast("int"), "key", F.col("last.value").alias("value"), F.col("last.offset").alias("offset")
    )
