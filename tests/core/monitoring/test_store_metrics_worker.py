"""A real worker run against a real broker reports its store metrics: one get and one put per
message of a running total, the record cache's hits and RocksDB reads adding up to the gets,
RocksDB's bytes written, timed calls and the commits' durations."""

from __future__ import annotations

from support.core_helpers import make_orders, orders_topic, totals_app

ORDERS = 2_000
CUSTOMERS = 50


def test_a_worker_run_reports_a_get_and_a_put_per_message(kafka_bootstrap, unique_name, tmp_path):
    orders = make_orders(ORDERS, customers=CUSTOMERS)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 2, orders)
    app = totals_app(kafka_bootstrap, source, tmp_path, unique_name("store-metrics"))

    report = app.run_worker(max_seconds=120)

    assert report.stop_reason == "caught_up" and report.total_processed == ORDERS
    totals = report.store_metrics["totals"]
    assert totals.operation("get").count == totals.operation("put").count == ORDERS
    assert totals.operation("delete").count == totals.operation("fold").count == 0
    assert totals.partitions == 2
    assert totals.cache_hits + totals.cache_misses == ORDERS and totals.cache_misses >= CUSTOMERS
    assert totals.cache_hit_ratio == totals.cache_hits / ORDERS
    get_latency = totals.operation("get").latency
    assert get_latency.samples >= 2 and 0 < get_latency.p50_seconds <= get_latency.p99_seconds
    assert totals.rocksdb is not None and totals.rocksdb.bytes_written > 0
    assert report.store_totals.operation("put").count == ORDERS
    assert report.commit_latency.samples >= 1 and report.commit_latency.p99_seconds > 0
