"""Foreign-key joins under a real worker and broker: orders (a compacted table of 2 partitions, each
naming its customer) joined with customers (a compacted global table of 3 partitions: no
co-partitioning), both updated, deleted and moved over three runs, the state and the table's copy
deleted between the first two (the second restores the join state from the aggressively compacted
changelog and reads the customers again from where each task partition's commit left them), the
third run given updates of customers only (which must reach the orders that reference them). Judged
against the join recomputed from the two topics: each order's latest output is its latest value
merged with its customer's latest value (a tombstone or nothing where the join does not hold), and
every value ever sent is a merge of an order and of that order's customer."""

from __future__ import annotations

import random
import shutil
import time
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer
from support.core_helpers import FAST_COMMITS, FAST_GROUP
from support.kafka_helpers import create_topic, latest_of, read_committed

from dagster_stateful.core import App

EPOCH = time.time_ns() // 1_000_000 - 36_000_000
AGGRESSIVE_COMPACTION = {"segment.ms": "300", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "100"}
COMPACTED = {"cleanup.policy": "compact", **AGGRESSIVE_COMPACTION}


def produce(bootstrap: str, topic: str, records: list[tuple[str, Any]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for index, (key, value) in enumerate(records):
        producer.produce(topic, key=key, value=None if value is None else orjson.dumps(value), timestamp=EPOCH + index)
    assert producer.flush(30) == 0


def order_updates(rng: random.Random, count: int, start: int) -> list[tuple[str, Any]]:
    return [
        (
            f"o{rng.randrange(60)}",
            None if rng.random() < 0.15 else {"order": start + i, "customer": f"c{rng.randrange(12)}"},
        )
        for i in range(count)
    ]


def customer_updates(rng: random.Random, count: int, start: int) -> list[tuple[str, Any]]:
    updates = []
    for i in range(count):
        key = f"c{rng.randrange(12)}"
        updates.append((key, None if rng.random() < 0.2 else {"tier": start + i, "id": key}))
    return updates


@pytest.mark.parametrize(
    ("guarantee", "how"), [("exactly-once", "inner"), ("at-least-once", "inner"), ("at-least-once", "left")]
)
def test_a_foreign_key_join_ends_with_each_orders_latest_value_merged_with_its_customers(
    kafka_bootstrap, unique_name, tmp_path, guarantee, how
):
    rng = random.Random(37)
    orders, customers = unique_name("orders"), unique_name("customers")
    create_topic(kafka_bootstrap, orders, 2, COMPACTED)
    create_topic(kafka_bootstrap, customers, 3, COMPACTED)
    name = unique_name("customer-orders")
    output = f"{name}-joined"
    create_topic(kafka_bootstrap, output, 2)
    app = App(
        name=name,
        source=orders,
        output=output,
        stores=["rows"],
        state_dir=tmp_path,
        kafka=kafka_bootstrap,
        processing_guarantee=guarantee,
        consumer_config=FAST_GROUP,
        changelog_config=AGGRESSIVE_COMPACTION,
        commit_every=25,
        **FAST_COMMITS,
    )
    table = app.global_table(customers)
    app.to_topic(app.dataframe().table_join(table, on="customer", how=how, on_merge="keep-left"))

    reports = []
    for run in range(3):
        if run < 2:
            produce(kafka_bootstrap, orders, order_updates(rng, 150, run * 1000))
        produce(kafka_bootstrap, customers, customer_updates(rng, 40, run * 1000))
        reports.append(app.run_worker(max_seconds=120))
        assert reports[-1].stop_reason == "caught_up", reports[-1]
        if run == 0:
            shutil.rmtree(tmp_path / name)
    assert reports[1].restores, "the second run restored the deleted state from the changelog"
    assert reports[2].stream_records_joined > 0, "the third run took in customer updates"

    left, right = latest_of(kafka_bootstrap, orders), latest_of(kafka_bootstrap, customers)
    expected = {}
    for key, order in left.items():
        customer = None if order is None else right.get(order["customer"])
        if order is not None and (customer is not None or how == "left"):
            expected[key] = {**(customer or {}), **order}
    got = latest_of(kafka_bootstrap, output)
    assert {key: value for key, value in got.items() if value is not None} == expected
    assert sum(1 for value in expected.values() if "tier" in value) > 20, expected
    for message in read_committed(kafka_bootstrap, output):
        if message.value() is not None:
            value = orjson.loads(message.value())
            assert "id" not in value or value["id"] == value["customer"], value  # joined with the order's customer
