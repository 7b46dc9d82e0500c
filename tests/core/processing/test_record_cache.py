"""The record cache bounded in bytes, against a real broker: a cache too small for the uncommitted
writes makes the worker commit early, its memory stays within the bound (give or take one consumed
batch), and the totals, in the store and restored from the changelog, are those of the source."""

from __future__ import annotations

import shutil
from typing import Any

from support.core_helpers import expected_totals, make_orders, orders_topic, totals_app, totals_in_store

from dagster_stateful.core.processing.worker.loop import CONSUME_BATCH
from dagster_stateful.core.state.cache import entry_bytes

ORDERS = 4_000
CUSTOMERS = 800
SMALL_CACHE = 16 * 1024


def test_a_small_cache_commits_early_stays_bounded_and_loses_nothing(kafka_bootstrap, unique_name, tmp_path):
    orders = make_orders(ORDERS, customers=CUSTOMERS)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 2, orders)
    name = unique_name("small-cache")
    never_by_time: dict[str, Any] = {"commit_interval": 300.0, "commit_every": 10 * ORDERS}
    app = totals_app(kafka_bootstrap, source, tmp_path, name, cache_max_bytes=SMALL_CACHE, **never_by_time)

    report = app.run_worker(max_seconds=120)

    assert report.stop_reason == "caught_up" and report.total_processed == ORDERS
    assert report.cache_commits >= 2, "800 customers' totals do not fit in 16 KiB: the cache must commit early"
    largest_entry = entry_bytes(b"\0\0\0\4c999total", b"99999")
    assert report.cache_bytes_peak <= SMALL_CACHE + CONSUME_BATCH * largest_entry
    assert totals_in_store(app, 2) == expected_totals(orders)

    shutil.rmtree(tmp_path / name)
    restored = totals_app(kafka_bootstrap, source, tmp_path, name, cache_max_bytes=SMALL_CACHE, **never_by_time)
    assert restored.run_worker(max_seconds=120).total_processed == 0
    assert totals_in_store(restored, 2) == expected_totals(orders), "the early commits reached the changelog"


def test_the_default_cache_holds_a_modest_key_space_without_early_commits(kafka_bootstrap, unique_name, tmp_path):
    orders = make_orders(ORDERS, customers=CUSTOMERS)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 2, orders)
    app = totals_app(kafka_bootstrap, source, tmp_path, unique_name("default-cache"), commit_interval=300.0)

    report = app.run_worker(max_seconds=120)

    assert report.cache_commits == 0 and 0 < report.cache_bytes_peak <= app.config.cache_max_bytes
    assert totals_in_store(app, 2) == expected_totals(orders)
