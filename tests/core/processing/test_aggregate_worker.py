"""Aggregations folded message by message in a worker, against a real broker with aggressive changelog
compaction (the columnar path, under both guarantees, is test_vectorized_worker.py's): the totals an
`aggregate(Sum(...))` keeps (in the store, in the output topic, and
restored from the changelog alone) are those recomputed from the source topic, and processing
continues from the restored aggregates."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
from support.core_helpers import FAST_COMMITS, FAST_GROUP, expected_totals, make_orders, orders_topic, totals_in_store
from support.kafka_helpers import create_topic, produce, read_keyed

from dagster_stateful.core import App, Sum

PARTITIONS = 3
CUSTOMERS = 150
AGGRESSIVE_COMPACTION = {"segment.ms": "300", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "100"}


def amount(order: dict) -> int:
    return order["amount"]


def aggregating_app(bootstrap: str, source: str, state_dir: Path, name: str, guarantee: str) -> App:
    """Totals per customer with `aggregate(Sum(...))` in store "totals" (state key "total"), each new
    total sent to the app's output topic."""
    app = App(
        name=name,
        source=source,
        output=f"{name}-totals",
        stores=["totals"],
        state_dir=state_dir,
        kafka=bootstrap,
        processing_guarantee=guarantee,
        consumer_config=FAST_GROUP,
        changelog_config=AGGRESSIVE_COMPACTION,
        commit_every=100,
        **FAST_COMMITS,
    )
    app.to_topic(app.dataframe().aggregate(Sum(amount), name="total"))
    return app


def running_totals(orders: list[tuple[bytes, bytes]]) -> dict[str, list[int]]:
    """Per customer, the total after each of its orders."""
    running: dict[str, list[int]] = {}
    for key, value in orders:
        totals = running.setdefault(key.decode(), [])
        totals.append((totals[-1] if totals else 0) + orjson.loads(value)["amount"])
    return running


def outputs_per_customer(bootstrap: str, topic: str) -> dict[str, list[int]]:
    outputs: dict[str, list[int]] = {}
    for key, value in read_keyed(bootstrap, topic):
        assert value is not None
        outputs.setdefault(key.decode(), []).append(orjson.loads(value))
    return outputs


@pytest.mark.parametrize("guarantee", ["at-least-once"])  # exactly-once: test_vectorized_worker.py's columnar twin
def test_aggregated_totals_equal_the_source_and_continue_after_a_restore(
    kafka_bootstrap, unique_name, tmp_path, guarantee
):
    orders = make_orders(3_000, CUSTOMERS)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), PARTITIONS, orders)
    name = unique_name("aggregate")
    create_topic(kafka_bootstrap, f"{name}-totals", PARTITIONS)
    app = aggregating_app(kafka_bootstrap, source, tmp_path, name, guarantee)

    first = app.run_worker(max_seconds=120)

    assert first.stop_reason == "caught_up" and first.total_processed == len(orders)
    assert totals_in_store(app, PARTITIONS) == expected_totals(orders)

    more = make_orders(1_500, CUSTOMERS, start=len(orders))
    produce(kafka_bootstrap, source, more)
    shutil.rmtree(tmp_path / name)  # a new machine: the aggregates come back from the changelog alone
    restarted = aggregating_app(kafka_bootstrap, source, tmp_path, name, guarantee)

    second = restarted.run_worker(max_seconds=120)

    assert second.stop_reason == "caught_up" and second.total_processed == len(more)
    assert sum(restore.records_applied for restore in second.restores) > 0
    assert totals_in_store(restarted, PARTITIONS) == expected_totals(orders + more)
    assert outputs_per_customer(kafka_bootstrap, f"{name}-totals") == running_totals(orders + more), (
        "nothing crashed: each order's new total was sent once, in order"
    )
