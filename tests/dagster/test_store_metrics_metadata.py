"""A run's store metrics as Dagster metadata: plain numbers the UI plots, every store together in the
run's metadata (`totals.`), one store's (or one store partition's) in its own materialization (`store.`)."""

from __future__ import annotations

from dagster import MarkdownMetadataValue

from dagster_stateful.core.monitoring.report import WorkerReport
from dagster_stateful.core.state.latency import Latency
from dagster_stateful.core.state.metrics import ALL_STORES, OperationMetrics, RocksDBCounters, StoreMetrics
from dagster_stateful.metadata import store_run_metadata, worker_metadata


def store_metrics(store: str, gets: int, p99_seconds: float) -> StoreMetrics:
    return StoreMetrics(
        store,
        partitions=2,
        operations={
            "get": OperationMetrics(gets, Latency(gets // 64, 2e-6, 1e-6, p99_seconds)),
            "put": OperationMetrics(gets, Latency(gets // 64, 3e-6, 2e-6, 9e-6)),
        },
        cache_hits=gets - 100,
        cache_misses=100,
        rocksdb=RocksDBCounters(bytes_read=4_000, bytes_written=250_000, pending_compaction_bytes=0),
    )


def report() -> WorkerReport:
    return WorkerReport(
        "orders-app",
        messages_processed={0: 1000, 1: 1000},
        store_metrics={"totals": store_metrics("totals", 2000, 8e-6), "counts": store_metrics("counts", 500, 5e-6)},
        partition_store_metrics={("counts", 0): store_metrics("counts", 300, 4e-6)},
        store_totals=store_metrics(ALL_STORES, 2500, 8e-6),
        commit_latency=Latency(samples=4, mean_seconds=0.012, p50_seconds=0.011, p99_seconds=0.020),
    )


def test_worker_metadata_carries_every_stores_metrics_and_the_commit_latency():
    metadata = worker_metadata(report())

    assert metadata["totals.get_count"] == metadata["totals.put_count"] == 2500
    assert metadata["totals.get_p99_ms"] == 0.008 and metadata["totals.get_mean_ms"] == 0.002
    assert metadata["totals.delete_count"] == metadata["totals.fold_count"] == metadata["totals.range_count"] == 0
    assert metadata["totals.cache_hit_ratio"] == round(2400 / 2500, 4)
    assert metadata["totals.rocksdb_bytes_written"] == 250_000 and metadata["totals.rocksdb_bytes_read"] == 4_000
    assert metadata["totals.rocksdb_pending_compaction_bytes"] == 0
    assert (metadata["commits"], metadata["commit_p50_ms"], metadata["commit_p99_ms"]) == (4, 11.0, 20.0)
    table = metadata["store_metrics"]
    assert isinstance(table, MarkdownMetadataValue) and "| totals | 2 | 2000 |" in table.value
    plotted = {name: value for name, value in metadata.items() if name.startswith(("totals.", "commits", "commit_p"))}
    assert all(isinstance(value, int | float) for value in plotted.values()), plotted


def test_a_store_materialization_carries_its_own_metrics_only():
    run = report()
    metadata = {**worker_metadata(run, store_totals=False), **store_run_metadata(run, "counts")}

    assert metadata["store.get_count"] == 500 and metadata["store.get_p99_ms"] == 0.005
    assert metadata["commit_p99_ms"] == 20.0
    assert not any(name.startswith("totals.") for name in metadata) and "store_metrics" not in metadata
    assert store_run_metadata(run, "never-committed")["store.get_count"] == 0
    assert store_run_metadata(run, "counts", partition=0)["store.get_count"] == 300, "one partition's own"
    assert store_run_metadata(run, "counts", partition=1)["store.get_count"] == 0
