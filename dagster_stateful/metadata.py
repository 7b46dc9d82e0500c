"""Turning the core's results into the metadata a person wants to see in the Dagster UI.

Owns the metadata of worker runs (messages, committed offsets, restores, lag, rebalances, bad
messages, commit latency, store metrics), of store partitions (keys, bytes on disk, offsets, how far
behind the changelog; with standby replicas, where the active copy and the standbys are), of topics
(partitions, config, low/high offsets; each changelog's as provisioning found it) and of a
snapshot's decoded table (its columns, rows and a sample, which the UI shows as a table). Plain
numbers where the UI can plot them, JSON or Markdown tables where a breakdown helps.

A run's store metrics (see `core.monitoring.store_metrics`) are plain numbers under a prefix:
`totals.` for every store together in a run's metadata, `store.` for one store in its own
materialization: `<prefix>.<operation>_count`, `_mean_ms` and `_p99_ms` for each operation (get, put,
delete, fold, range), `<prefix>.cache_hit_ratio`, and for RocksDB stores
`<prefix>.rocksdb_bytes_read`, `_bytes_written` and `_pending_compaction_bytes`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import orjson
import pyarrow as pa
from dagster import AssetKey, MetadataValue, TableColumn, TableRecord, TableSchema

from dagster_stateful.core.app import App
from dagster_stateful.core.kafka.provisioning import ProvisioningPlan, TopicRole
from dagster_stateful.core.monitoring.report import RestoreReport, WorkerReport
from dagster_stateful.core.queries.describe import PartitionDescription
from dagster_stateful.core.queries.key_reads import client_state_root, copy_behind
from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest
from dagster_stateful.core.state.latency import Latency
from dagster_stateful.core.state.metrics import OPERATIONS, StoreMetrics
from dagster_stateful.naming import changelog_key
from dagster_stateful.translator import StatefulTranslator

SHOWN_TOPIC_CONFIGS = (
    "cleanup.policy",
    "min.insync.replicas",
    "segment.bytes",
    "segment.ms",
    "min.cleanable.dirty.ratio",
    "max.compaction.lag.ms",
    "delete.retention.ms",
    "retention.ms",
)
"""The topic settings a changelog's metadata shows."""


def worker_metadata(report: WorkerReport, store_totals: bool = True) -> dict[str, Any]:
    """A run's metadata; `store_totals`: with the metrics of every store together (a store's own
    materialization carries its own instead, see `store_run_metadata`)."""
    return {
        "processing_guarantee": report.processing_guarantee,
        "stop_reason": report.stop_reason.value,
        "messages_processed": report.total_processed,
        "messages_in_columns": report.messages_in_columns,
        "messages_per_partition": MetadataValue.json({str(p): n for p, n in sorted(report.messages_processed.items())}),
        "committed_offsets": MetadataValue.json({str(p): o for p, o in sorted(report.committed_offsets.items())}),
        "lag_left": report.total_lag,
        "lag_per_partition": MetadataValue.json({str(p): n for p, n in sorted(report.lag.items())}),
        "rebalances_seen": report.rebalances,
        "partitions_lost": report.partitions_lost,
        "stores_recovered": report.stores_recovered,
        "skipped_messages": report.skipped,
        "dead_lettered_messages": report.dead_lettered,
        "transactions_aborted": report.transactions_aborted,
        "duration_seconds": round(report.seconds, 3),
        **commit_metadata(report.commit_latency),
        **(store_totals_metadata(report) if store_totals else {}),
        **restore_metadata(report.restores),
    }


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 4)


def commit_metadata(latency: Latency) -> dict[str, Any]:
    """How long the run's commits took (those that committed something)."""
    return {
        "commits": latency.samples,
        "commit_p50_ms": _ms(latency.p50_seconds),
        "commit_p99_ms": _ms(latency.p99_seconds),
    }


def store_metrics_metadata(metrics: StoreMetrics, prefix: str) -> dict[str, Any]:
    """One store's (or every store's) metrics as numbers the UI plots, each named `<prefix>.<figure>`."""
    entries: dict[str, Any] = {}
    for name in OPERATIONS:
        operation = metrics.operation(name)
        entries[f"{prefix}.{name}_count"] = operation.count
        entries[f"{prefix}.{name}_mean_ms"] = _ms(operation.latency.mean_seconds)
        entries[f"{prefix}.{name}_p99_ms"] = _ms(operation.latency.p99_seconds)
    if metrics.cache_hit_ratio is not None:
        entries[f"{prefix}.cache_hit_ratio"] = round(metrics.cache_hit_ratio, 4)
    if metrics.rocksdb is not None:
        entries[f"{prefix}.rocksdb_bytes_read"] = metrics.rocksdb.bytes_read
        entries[f"{prefix}.rocksdb_bytes_written"] = metrics.rocksdb.bytes_written
        entries[f"{prefix}.rocksdb_pending_compaction_bytes"] = metrics.rocksdb.pending_compaction_bytes
    return entries


def store_totals_metadata(report: WorkerReport) -> dict[str, Any]:
    """Every store's metrics together (`totals.`), and a table of each store's."""
    rows = [
        "| store | partitions | gets | puts | deletes | folds | ranges | p99 ms (get / put / fold) | cache hit ratio | "
        "RocksDB bytes read / written |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows += [_store_row(metrics) for metrics in report.store_metrics.values()]
    return {
        **store_metrics_metadata(report.store_totals, "totals"),
        "store_metrics": MetadataValue.md("\n".join(rows) if report.store_metrics else "No store was committed."),
    }


def _store_row(metrics: StoreMetrics) -> str:
    counts = " | ".join(str(metrics.operation(name).count) for name in OPERATIONS)
    p99 = " / ".join(f"{_ms(metrics.operation(name).latency.p99_seconds):g}" for name in ("get", "put", "fold"))
    ratio = "n/a" if metrics.cache_hit_ratio is None else f"{metrics.cache_hit_ratio:.3f}"
    rocksdb = "n/a" if metrics.rocksdb is None else f"{metrics.rocksdb.bytes_read} / {metrics.rocksdb.bytes_written}"
    return f"| {metrics.store} | {metrics.partitions} | {counts} | {p99} | {ratio} | {rocksdb} |"


def store_run_metadata(report: WorkerReport, store: str, partition: int | None = None) -> dict[str, Any]:
    """`store`'s metrics in a run (`store.`), or one partition's of it, for its materialization: zero
    when the run committed none of it."""
    metrics = (
        report.store_metrics.get(store) if partition is None else report.partition_store_metrics.get((store, partition))
    )
    return store_metrics_metadata(metrics or StoreMetrics(store), "store")


def restore_metadata(restores: Iterable[RestoreReport]) -> dict[str, Any]:
    restores = list(restores)
    rows = ["| store | partition | kind | offsets | applied | skipped | seconds |", "|---|---|---|---|---|---|---|"]
    rows += [
        f"| {r.store} | {r.partition} | {r.kind} | {r.start_offset}..{r.end_offset} | {r.records_applied} | "
        f"{r.records_skipped} | {r.seconds:.3f} |"
        for r in restores
    ]
    return {
        "restores": len(restores),
        "records_restored": sum(r.records_applied for r in restores),
        "restore_seconds": round(sum(r.seconds for r in restores), 3),
        "restore_details": MetadataValue.md("\n".join(rows) if restores else "No restore was needed."),
    }


def partitions_metadata(descriptions: Iterable[PartitionDescription]) -> dict[str, Any]:
    descriptions = list(descriptions)
    return {
        "keys": sum(d.keys or 0 for d in descriptions),
        "keys_exact": all(d.keys_exact for d in descriptions),
        "bytes_on_disk": sum(d.bytes_on_disk for d in descriptions),
        "changelog_lag": sum(d.changelog_lag for d in descriptions),
        "keys_per_partition": MetadataValue.json({str(d.partition): d.keys for d in descriptions}),
        "bytes_per_partition": MetadataValue.json({str(d.partition): d.bytes_on_disk for d in descriptions}),
        "local_changelog_offsets": MetadataValue.json(
            {str(d.partition): d.local_changelog_offset for d in descriptions}
        ),
        "committed_source_offsets": MetadataValue.json(
            {str(d.partition): d.committed_source_offset for d in descriptions}
        ),
    }


def partition_metadata(description: PartitionDescription) -> dict[str, Any]:
    return {
        "keys": description.keys if description.keys is not None else -1,
        "keys_exact": description.keys_exact,
        "bytes_on_disk": description.bytes_on_disk,
        "local_changelog_offset": description.local_changelog_offset
        if description.local_changelog_offset is not None
        else -1,
        "changelog_high": description.changelog_high,
        "changelog_lag": description.changelog_lag,
        "committed_source_offset": (
            description.committed_source_offset if description.committed_source_offset is not None else -1
        ),
        "source_lag": description.source_lag,
    }


def copies_metadata(app: App, report: WorkerReport, description: PartitionDescription) -> dict[str, Any]:
    """With standby replicas: the member holding the partition's active copy (the run's) and those
    keeping its standbys, each with how many changelog records it is behind (None: on another host)."""
    if not app.config.num_standby_replicas:
        return {}
    marks = (description.changelog_low, description.changelog_high)
    standbys = []
    for client_id in report.standby_holders.get(description.partition, []):
        root = client_state_root(client_id, app.name)
        behind = (
            None if root is None else copy_behind(app.config, root, description.store, description.partition, marks)
        )
        standbys.append({"member": client_id, "changelog_records_behind": behind})
    return {"active_copy": app.worker_client_id, "standby_copies": MetadataValue.json(standbys)}


def topic_metadata(
    partitions: int, config: dict[str, str], watermarks: dict[int, tuple[int, int]], status: str
) -> dict[str, Any]:
    return {
        "status": status,
        "partitions": partitions,
        "config": MetadataValue.json(config),
        "low_offsets": MetadataValue.json({str(p): low for p, (low, _) in sorted(watermarks.items())}),
        "high_offsets": MetadataValue.json({str(p): high for p, (_, high) in sorted(watermarks.items())}),
        "records_upper_bound": sum(high - low for low, high in watermarks.values()),
    }


def changelog_states(
    app: App, bound: App, plan: ProvisioningPlan, translator: StatefulTranslator
) -> Iterator[tuple[AssetKey, dict[str, Any]]]:
    """Per internal topic of `app` (its changelogs, and its repartition topic when it re-keys): its
    asset key and what provisioning found or did (status, partitions, settings, offsets)."""
    for check in plan.checks:
        role = check.spec.role
        if role is TopicRole.CHANGELOG:
            store = check.spec.name.removeprefix(f"{app.name}-").removesuffix("-changelog")
            key = changelog_key(app, store, translator)
        elif role is TopicRole.REPARTITION:
            key = translator.get_repartition_key(app)
        else:
            continue
        topic, partitions = check.spec.name, check.found_partitions or 0
        config = {k: v for k, v in bound.kafka.topic_config(topic).items() if k in SHOWN_TOPIC_CONFIGS}
        marks = bound.kafka.watermarks(topic, range(partitions))
        yield key, topic_metadata(partitions, config, marks, check.status.value)


def snapshot_metadata(manifest: SnapshotManifest, location: str) -> dict[str, Any]:
    """A snapshot asset's materialization: what it holds, where it ends and what restores replay after it."""
    changelog_ends = {int(p): int(o) for p, o in manifest.extra.get("changelog_end_offsets", {}).items()}
    left = {p: end - manifest.end_offsets.get(p, end) for p, end in sorted(changelog_ends.items())}
    return {
        "snapshot_id": manifest.snapshot_id,
        "location": location,
        "keys": sum(manifest.key_counts.values()),
        "keys_per_partition": MetadataValue.json({str(p): n for p, n in manifest.key_counts.items()}),
        "end_offsets": MetadataValue.json({str(p): o for p, o in manifest.end_offsets.items()}),
        "changelog_end_offsets": MetadataValue.json({str(p): o for p, o in changelog_ends.items()}),
        "committed_source_offsets": MetadataValue.json(manifest.extra.get("committed_source_offsets", {})),
        "partitions_cut_short": sum(1 for records in left.values() if records > 0),
        "records_left_to_replay": MetadataValue.json({str(p): n for p, n in left.items()}),
        "previous_snapshot": manifest.previous or "none",
        "sst_image": bool(manifest.sst_image),
        "sst_image_files": sum(len(files) for files in manifest.sst_image.values()),
        "seconds": manifest.extra.get("seconds", 0.0),
    }


def table_snapshot_metadata(manifest: SnapshotManifest, location: str) -> dict[str, Any]:
    """A partitioned table's snapshot asset's materialization: as a store snapshot's, with the
    positions the group's commits applied the table to (where it is cut) instead of source offsets;
    `records_left_to_replay` counts the topic's records past them."""
    metadata = snapshot_metadata(manifest, location)
    del metadata["committed_source_offsets"]
    positions = manifest.extra.get("committed_table_positions", {})
    return metadata | {
        "committed_table_positions": MetadataValue.json(positions),
        "stream_topic": manifest.extra.get("stream_topic", ""),
    }


STATE_TABLE_SAMPLE_ROWS = 10


def state_table_metadata(table: pa.Table, location: str) -> dict[str, Any]:
    """A snapshot's decoded table: where it is, its columns and row count (Dagster's own keys, which
    the UI shows on the asset), and its first rows as a table."""
    schema = TableSchema(columns=[TableColumn(field.name, str(field.type)) for field in table.schema])
    sample = [
        TableRecord({name: _cell(value) for name, value in row.items()})
        for row in table.slice(0, STATE_TABLE_SAMPLE_ROWS).to_pylist()
    ]
    return {
        "state_table": MetadataValue.path(location),
        "dagster/column_schema": schema,
        "dagster/row_count": table.num_rows,
        "state_table_sample": MetadataValue.table(sample, schema),
    }


def _cell(value: Any) -> str | int | float | bool | None:
    """A table cell the UI shows: a scalar as it is, anything else as its JSON text."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return orjson.dumps(value, default=repr).decode()
