"""The compaction snapshot job: the committed part of a changelog folded into the store's next snapshot, with Spark.

Owns `build_snapshot`, a plain function of a SparkSession, and `snapshot_changelog`, which reads the
offsets it needs from Kafka (the group's committed source offsets first, then the changelog's
ends) and runs it. It reads the changelog with Spark's
Kafka source from the previous snapshot's end offsets (or the beginning) and, per partition, cuts
the range at the first record written for a message the consumer group has not committed (its
processed-offset header is at or past the committed source offset, or it has no header where the
group's last commit counts such records as uncommitted, `changelog_format`): such records are left to the
changelog replay that follows a snapshot load, which applies its own skip rule. Below the cut it
keeps the latest value per key and partition (by offset), lets those rows replace the previous
snapshot's (a tombstone removes the key), drops tombstones, and writes Parquet, one directory per
Kafka partition with rows sorted by the raw key bytes, then (unless `sst_image=False`) the same
rows as RocksDB SST files, the snapshot's image (`snapshot_image`), written by Spark tasks as a
bulk restore's are, so that loading a partition is a copy and an ingest. The manifest, written
last, records the cut as the end offsets and lists the image's files; older snapshots are pruned
to `keep`. A partitioned table's topic, whose records carry no processing headers, is cut at the
offsets given instead (`table_snapshots`). Where a partition would end before the previous
snapshot does (a recreated topic), the new snapshot is built from the topic's beginning. Runs
unchanged on `local[*]` or a cluster.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.recovery.changelog_format import SOURCE_OFFSET_HEADER, bare_uncommitted_from
from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest, SnapshotStore
from dagster_stateful.core.state.commit_metadata import decode_commit_metadata
from dagster_stateful.spark.bulk_restore import write_sst_files

log = logging.getLogger(__name__)

_OFFSET_BYTES = 8


@dataclass(frozen=True)
class ChangelogSnapshot:
    manifest: SnapshotManifest
    changelog_ends: dict[int, int]
    committed: Mapping[int, int | None]


def snapshot_changelog(
    spark: SparkSession,
    kafka: KafkaClients,
    kafka_options: dict[str, str],
    consumer_group: str,
    source: str,
    changelog_topic: str,
    snapshots: SnapshotStore,
    keep: int = 3,
    sst_image: bool = True,
) -> ChangelogSnapshot:
    """A new snapshot of `changelog_topic` up to its current end, cut where the group's commits end."""
    partitions = range(kafka.partition_count(changelog_topic) or 0)
    # Committed offsets first, then the ends: changelog records are delivered before their source
    # offsets are committed, and the snapshot stops at the first record of an uncommitted message.
    positions = kafka.committed(consumer_group, source, partitions)
    ends = {p: high for p, (_, high) in kafka.watermarks(changelog_topic, partitions, committed=True).items()}
    committed = {p: offset for p, (offset, _) in positions.items()}
    bare_from = _bare_uncommitted_offsets(positions, source, snapshots.store)
    manifest = build_snapshot(
        spark, kafka_options, changelog_topic, ends, committed, snapshots, keep, sst_image, bare_from
    )
    return ChangelogSnapshot(manifest, ends, committed)


def _bare_uncommitted_offsets(
    positions: Mapping[int, tuple[int | None, str | None]], source: str, store: str
) -> dict[int, int]:
    """Per partition, the changelog offset from which records without headers are of uncommitted
    messages, as the group's last commit says (`changelog_format.bare_uncommitted_from`)."""
    bare_from = {}
    for partition, (offset, metadata) in positions.items():
        recorded = decode_commit_metadata(metadata, offset, f"{source}[{partition}]")
        start = bare_uncommitted_from(offset, recorded.changelog_ends.get(store), recorded.bare_uncommitted)
        if start is not None:
            bare_from[partition] = start
    return bare_from


def build_snapshot(
    spark: SparkSession,
    kafka_options: dict[str, str],
    changelog_topic: str,
    end_offsets: dict[int, int],
    committed_offsets: Mapping[int, int | None] | None,
    snapshots: SnapshotStore,
    keep: int = 3,
    sst_image: bool = True,
    bare_uncommitted_from: Mapping[int, int] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> SnapshotManifest:
    """Fold the committed part of `changelog_topic` up to `end_offsets` (partition -> exclusive end)
    into a new snapshot.

    kafka_options: `kafka.*` options of Spark's Kafka source (`kafka.bootstrap.servers`, security).
    committed_offsets: the app's consumer group's committed source offset per partition (None, or
    absent: never committed), read before `end_offsets`. A partition's snapshot ends at its
    changelog end or at the first record in the range read whose processed source offset is at or
    past the committed one, whichever comes first. A block's first record names the block's first
    offset, so the cut falls there for a block of an uncommitted commit, before its records without
    headers; such a record outside a block counts as committed, unless it lies at or past its
    partition's offset in `bare_uncommitted_from` (see `changelog_format`). None instead of a
    mapping: the topic's records carry no processing headers (a partitioned table's topic, which its
    producers write), and the snapshot ends exactly at `end_offsets`. sst_image: also write the
    partitions as SST files, which a load ingests as they are. extra: more entries of the
    manifest's `extra`.
    """
    previous = _extendable(snapshots.latest(), end_offsets, changelog_topic)
    start_offsets = {p: (previous.end_offsets.get(p, 0) if previous else 0) for p in end_offsets}
    started = time.monotonic()
    records = _changelog_records(
        spark,
        kafka_options,
        changelog_topic,
        (start_offsets, end_offsets),
        committed_offsets,
        bare_uncommitted_from or {},
    )
    try:
        snapshot_id, cut, cut_seconds = _write_snapshot(
            spark, records, end_offsets, snapshots, previous, committed_offsets is not None
        )
    finally:
        if records is not None:
            records.unpersist()
    key_counts = snapshots.count_keys(snapshot_id, sorted(end_offsets))
    imaged = time.monotonic()
    image = _write_image(spark, snapshots, snapshot_id, key_counts) if sst_image else {}
    image_seconds = time.monotonic() - imaged
    cut_short = {p: end_offsets[p] for p in sorted(cut) if cut[p] < end_offsets[p]}
    manifest = SnapshotManifest(
        app=snapshots.app,
        store=snapshots.store,
        changelog_topic=changelog_topic,
        snapshot_id=snapshot_id,
        created_at=time.time(),
        end_offsets=cut,
        key_counts=key_counts,
        previous=previous.snapshot_id if previous else None,
        sst_image=image,
        extra={
            "records_read_upper_bound": sum(end_offsets[p] - start_offsets[p] for p in end_offsets),
            "partitions_cut_short": len(cut_short),
            "changelog_end_offsets": {str(p): end for p, end in sorted(end_offsets.items())},
            **(
                {"committed_source_offsets": {str(p): committed_offsets.get(p) for p in sorted(end_offsets)}}
                if committed_offsets is not None
                else {}
            ),
            "seconds_finding_cut": round(cut_seconds, 3),
            "seconds_writing_image": round(image_seconds, 3),
            "seconds": round(time.monotonic() - started, 3),
            **(extra or {}),
        },
    )
    snapshots.write_manifest(manifest)
    pruned = snapshots.prune(keep)
    if cut_short:
        log.info(
            "Snapshot %s of %s stops short of the changelog's end in %d partition(s) at the first record of an "
            "uncommitted message (partition: snapshot end/changelog end): %s; the changelog replay after a "
            "snapshot load covers the rest",
            snapshot_id,
            changelog_topic,
            len(cut_short),
            ", ".join(f"{p}: {cut[p]}/{end}" for p, end in cut_short.items()),
        )
    log.info(
        "Snapshot %s of %s: %d keys up to %s (pruned %s)",
        snapshot_id,
        changelog_topic,
        sum(manifest.key_counts.values()),
        cut,
        pruned,
    )
    return manifest


def _extendable(
    previous: SnapshotManifest | None, end_offsets: Mapping[int, int], topic: str
) -> SnapshotManifest | None:
    """The previous snapshot, when the new one can start from its end: not when a partition would
    end before it (a recreated topic, or a table whose committed position moved back), whose rows
    the previous snapshot may hold from past the new end; the new snapshot is then built from the
    topic's beginning."""
    if previous is None:
        return None
    behind = {
        p: (end, previous.end_offsets[p]) for p, end in end_offsets.items() if end < previous.end_offsets.get(p, 0)
    }
    if not behind:
        return previous
    log.warning(
        "Snapshot %s of %s reaches past where the new snapshot ends in partitions %s (new end/previous end: %s): the "
        "topic was recreated or the committed positions moved back; building the new snapshot from the topic's "
        "beginning",
        previous.snapshot_id,
        topic,
        sorted(behind),
        ", ".join(f"{p}: {end}/{was}" for p, (end, was) in sorted(behind.items())),
    )
    return None


def _write_snapshot(
    spark: SparkSession,
    records: DataFrame | None,
    end_offsets: dict[int, int],
    snapshots: SnapshotStore,
    previous: SnapshotManifest | None,
    find_uncommitted: bool,
) -> tuple[str, dict[int, int], float]:
    """Write the new snapshot's Parquet; returns its id, its end offsets (the cut) and the seconds
    finding the cut took (`find_uncommitted`: cut at the first record of an uncommitted message)."""
    started = time.monotonic()
    uncommitted = _first_uncommitted(records) if find_uncommitted else {}
    cut_seconds = time.monotonic() - started
    cut = {p: min(end, uncommitted.get(p, end)) for p, end in end_offsets.items()}
    changes = _latest_changes(spark, records, cut)
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
    return snapshot_id, cut, cut_seconds


def _write_image(
    spark: SparkSession, snapshots: SnapshotStore, snapshot_id: str, key_counts: dict[int, int]
) -> dict[int, list[str]]:
    """The snapshot's rows written again as SST files under its image location; the files' names per partition."""
    image: dict[int, list[str]] = {partition: [] for partition in key_counts}
    holding = [partition for partition, keys in sorted(key_counts.items()) if keys]
    if not holding:  # a snapshot without rows has no Parquet file for Spark to read
        return image
    location = snapshots.image_location(snapshot_id)
    try:
        written = write_sst_files(spark, snapshots, snapshot_id, holding, location)
    except Exception as error:  # noqa: BLE001 - the snapshot is complete without its image; loads then read the Parquet
        log.warning(
            "Writing the SST image of snapshot %s at %s failed (%s); the snapshot is published without it, and loads "
            "read its Parquet rows. Spark's executors need rocksdict installed to write images.",
            snapshot_id,
            location,
            str(error).splitlines()[0] if str(error) else type(error).__name__,
        )
        return {}
    return image | {partition: [file.rsplit("/", 1)[-1] for file in files] for partition, (files, _) in written.items()}


def _changelog_records(
    spark: SparkSession,
    kafka_options: dict[str, str],
    topic: str,
    ranges: tuple[dict[int, int], dict[int, int]],
    committed: Mapping[int, int | None] | None,
    bare_from: Mapping[int, int],
) -> DataFrame | None:
    """The records in [start, end) of `ranges`, each marked `uncommitted` (see `_uncommitted`; none
    is when `committed` is None), read from Kafka once and kept (memory, then disk) for the passes
    over them; None when all ranges are empty."""
    start, end = ranges
    records = _kafka_records(spark, kafka_options, topic, start, end, headers=committed is not None)
    if records is None:
        return None
    if committed is None:
        return records.select(
            F.col("partition").cast("int").alias("partition"),
            "offset",
            "key",
            "value",
            F.lit(False).alias("uncommitted"),
        ).persist(StorageLevel.MEMORY_AND_DISK)
    committed_by_partition = F.create_map(
        *[column for p in sorted(end) for column in (F.lit(p), _offset_bytes(committed.get(p)))]
    )
    partition = F.col("partition").cast("int")
    uncommitted = _uncommitted(F.col("headers"), committed_by_partition[partition])
    if bare_from:
        bare_by_partition = F.create_map(
            *[column for p, o in sorted(bare_from.items()) for column in (F.lit(p), F.lit(o))]
        )
        uncommitted = uncommitted | _bare_uncommitted(F.col("headers"), F.col("offset"), bare_by_partition[partition])
    marked = records.select(partition.alias("partition"), "offset", "key", "value", uncommitted.alias("uncommitted"))
    return marked.persist(StorageLevel.MEMORY_AND_DISK)


def _kafka_records(
    spark: SparkSession,
    kafka_options: dict[str, str],
    topic: str,
    start: dict[int, int],
    end: dict[int, int],
    headers: bool = True,
) -> DataFrame | None:
    """The records in the offset ranges [start, end) of Spark's Kafka source (with their headers
    unless `headers` is False); None when all are empty."""
    partitions = [p for p in sorted(end) if end[p] > start[p]]
    if not partitions:
        return None
    reader = spark.read.format("kafka")
    for name, value in kafka_options.items():
        reader = reader.option(name, value)
    return (
        reader.option("assign", json.dumps({topic: partitions}))
        .option("startingOffsets", json.dumps({topic: {str(p): start[p] for p in partitions}}))
        .option("endingOffsets", json.dumps({topic: {str(p): end[p] for p in partitions}}))
        .option("failOnDataLoss", "false")  # compaction leaves gaps in the offsets
        .option("includeHeaders", str(headers).lower())
        .option("kafka.isolation.level", "read_committed")  # aborted transactions of exactly-once apps
        .load()
    )


def _first_uncommitted(records: DataFrame | None) -> dict[int, int]:
    """Per partition with one: the offset of its first record of an uncommitted message."""
    if records is None:
        return {}
    first = records.where("uncommitted").groupBy("partition").agg(F.min("offset").alias("first")).collect()
    return {int(row["partition"]): int(row["first"]) for row in first}


def _uncommitted(headers: Column, committed: Column) -> Column:
    """True for a record of a message the group has not committed.

    Such a record's first `source_offset` header (as `changelog_format.processed_offset` reads it) holds
    a processed offset at or past the committed one (`committed`: its 8 big-endian bytes; null
    when the group never committed). The engine writes exactly 8 bytes of a non-negative offset,
    so comparing the bytes compares the numbers, with no conversion per record; a value of any
    other length, or a negative one, counts as uncommitted: the snapshot stops before it and the
    changelog replay decides. A record without the header counts as committed: a block's other
    records lie after its first, where the cut of an uncommitted block falls.
    """
    named = F.filter(headers, lambda header: (header["key"] == SOURCE_OFFSET_HEADER) & header["value"].isNotNull())
    value = F.get(named, 0)["value"]
    return value.isNotNull() & (committed.isNull() | (F.length(value) != _OFFSET_BYTES) | (value >= committed))


def _bare_uncommitted(headers: Column, offset: Column, bare_from: Column) -> Column:
    """True for a record without headers at or past `bare_from` (null: no such offset for its partition)."""
    bare = headers.isNull() | (F.size(headers) == 0)
    return F.coalesce(bare & (offset >= bare_from), F.lit(False))


def _offset_bytes(offset: int | None) -> Column:
    if offset is None:
        return F.lit(None).cast("binary")
    return F.lit(bytearray(max(offset, 0).to_bytes(_OFFSET_BYTES, "big")))


def _latest_changes(spark: SparkSession, records: DataFrame | None, end: dict[int, int]) -> DataFrame:
    """The last record per (partition, key) before each partition's `end`; tombstones keep a null
    value, records without a key (which no store holds) are left out."""
    if records is None:
        return spark.createDataFrame([], "partition int, key binary, value binary, offset long")
    ends = F.create_map(*[column for p, offset in sorted(end.items()) for column in (F.lit(p), F.lit(offset))])
    latest = (
        records.where((F.col("offset") < ends[F.col("partition")]) & F.col("key").isNotNull())
        .groupBy("partition", "key")
        .agg(F.max_by(F.struct("value", "offset"), "offset").alias("last"))
    )
    return latest.select("partition", "key", F.col("last.value").alias("value"), F.col("last.offset").alias("offset"))
