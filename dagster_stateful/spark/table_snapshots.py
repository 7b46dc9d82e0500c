"""The snapshot job of a partitioned table's store: the table's topic folded into its next snapshot, with Spark.

Owns `snapshot_table`, a plain function of a SparkSession. It reads where each partition's snapshot
ends (`core.recovery.table_snapshots.table_cut`: the position the group's last commit applied the
table to, or the topic's beginning where no commit recorded one) and has the store snapshot job
(`snapshots.build_snapshot`) fold the table's topic, which is the table's changelog, up to there:
the latest value per key, tombstones and records without a key dropped, merged into the previous
snapshot, the same Parquet, SST image, manifest and pruning as a store's snapshot. The topic's
records are its producers', with no processing headers, so none is judged by them. The manifest's
`extra` records the table, the stream topic whose commits were read, each partition's committed
position and the topic's ends. A record the table's serializers refuse is kept as it is (a worker
leaves it to the error policy).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import SparkSession

from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest, SnapshotStore
from dagster_stateful.core.recovery.table_snapshots import TableCut, table_cut
from dagster_stateful.spark.snapshots import build_snapshot


@dataclass(frozen=True)
class TableSnapshot:
    manifest: SnapshotManifest
    cut: TableCut


def snapshot_table(
    spark: SparkSession,
    kafka: KafkaClients,
    kafka_options: dict[str, str],
    consumer_group: str,
    stream_topic: str,
    topic: str,
    snapshots: SnapshotStore,
    keep: int = 3,
    sst_image: bool = True,
) -> TableSnapshot:
    """A new snapshot of the table `snapshots` holds (its name: `snapshots.store`), whose records are
    in `topic`, cut where the group's last commits of `stream_topic` (the stream that joins the
    table, partition for partition) applied it."""
    table = snapshots.store
    cut = table_cut(kafka, consumer_group, stream_topic, table, topic)
    extra = {
        "table": table,
        "stream_topic": stream_topic,
        "committed_table_positions": {str(p): position for p, position in sorted(cut.positions.items())},
        # The topic's ends, not the cut: what a restore from the snapshot leaves the workers to read.
        "changelog_end_offsets": {str(p): end for p, end in sorted(cut.topic_ends.items())},
    }
    manifest = build_snapshot(spark, kafka_options, topic, cut.ends, None, snapshots, keep, sst_image, extra=extra)
    return TableSnapshot(manifest, cut)
