"""Expiring state in a worker, against a real broker with aggressive changelog compaction.

A de-duplicating app: a store of recently seen order ids with a TTL drops an order whose id it
still holds, and a plain store keeps each customer's total of the orders let through. Orders are
re-sent, some within the TTL (dropped) and some after it (let through again), with event times
that mostly advance and sometimes lag. What the worker passes on and keeps is compared with
`replay`, a recomputation from the source topic as Kafka has it (per partition, in offset order):
the orders let through (read_committed, under both guarantees), the totals, the ids still held
with their expiries, the changelog (expired ids tombstoned, the topic compacted only), and all of
it again after the local state is deleted and restored from the changelogs alone.
"""

from __future__ import annotations

import random
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer
from support.core_helpers import FAST_COMMITS, FAST_GROUP
from support.kafka_helpers import create_topic, read_committed, read_messages

from dagster_stateful.core import App, State, Store
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.state.keys import STREAM_TIME_KEY, split_store_key
from dagster_stateful.core.state.ttl import split_expiry

PARTITIONS = 2
CUSTOMERS = 10
TTL = 20_000
STEP = 100
"""Event time between two orders: an id is held for TTL / STEP = 200 orders."""
EPOCH = (time.time_ns() // 1_000_000 // 1000 - 36_000) * 1000
"""The first order's event time: ten hours ago, so no retention by time deletes the orders under test."""
AGGRESSIVE_COMPACTION = {"segment.ms": "300", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "100"}


def orders(count: int, start: int, rng: random.Random) -> list[tuple[bytes, bytes, int]]:
    """(key, value, timestamp): new orders, and one in five a copy of one of the last 500 (held or
    expired), sent again by its customer; one in ten lags up to 5 s."""
    sent: list[tuple[bytes, bytes, int]] = []
    for i in range(start, start + count):
        timestamp = EPOCH + i * STEP - (rng.randrange(5_000) if rng.random() < 0.1 else 0)
        if i > 50 and rng.random() < 0.2:
            order_id = rng.randrange(max(0, i - 500), i)
            customer = f"c{order_id % CUSTOMERS}"
        else:
            order_id, customer = i, f"c{i % CUSTOMERS}"
        order = {"id": order_id, "customer": customer, "amount": 1 + order_id % 7}
        sent.append((customer.encode(), orjson.dumps(order), timestamp))
    return sent


def produce_timed(bootstrap: str, topic: str, records: list[tuple[bytes, bytes, int]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for key, value, timestamp in records:
        producer.produce(topic, key=key, value=value, timestamp=timestamp)
    assert producer.flush(30) == 0


def first_sighting(order: dict, seen: State) -> bool:
    order_id = str(order["id"])
    if seen.exists(order_id):
        return False
    seen.set(order_id, order["amount"])
    return True


def add_to_total(order: dict, totals: State) -> None:
    totals.set("total", totals.get("total", 0) + order["amount"])


@dataclass
class Replayed:
    passed: Counter[int] = field(default_factory=Counter)
    """Order ids let through, with how often."""
    totals: dict[str, int] = field(default_factory=dict)
    held: dict[tuple[str, str], int] = field(default_factory=dict)
    """(customer, order id) still held, with its expiry."""


def replay(bootstrap: str, source: str) -> Replayed:
    by_partition: dict[int, list] = {}
    for message in read_messages(bootstrap, source):
        by_partition.setdefault(message.partition(), []).append(message)
    replayed = Replayed()
    for messages in by_partition.values():
        stream_time, held = -1, dict[tuple[str, str], int]()
        for message in sorted(messages, key=lambda m: m.offset()):
            stream_time = max(stream_time, message.timestamp()[1])
            order = orjson.loads(message.value())
            entry = (order["customer"], str(order["id"]))
            if held.get(entry, -1) > stream_time:
                continue
            held[entry] = stream_time + TTL
            replayed.passed[order["id"]] += 1
            replayed.totals[order["customer"]] = replayed.totals.get(order["customer"], 0) + order["amount"]
        replayed.held.update({entry: expiry for entry, expiry in held.items() if expiry > stream_time})
    return replayed


def dedup_app(bootstrap: str, source: str, state_dir: Path, name: str, guarantee: str) -> App:
    app = App(
        name=name,
        source=source,
        output=f"{name}-orders",
        stores=[Store("seen", ttl=TTL), "totals"],
        state_dir=state_dir,
        kafka=bootstrap,
        processing_guarantee=guarantee,
        consumer_config=FAST_GROUP,
        changelog_config=AGGRESSIVE_COMPACTION,
        commit_every=150,
        **FAST_COMMITS,
    )
    frame = app.dataframe().filter(first_sighting, store="seen").update(add_to_total, store="totals")
    app.to_topic(frame)
    return app


def let_through(bootstrap: str, topic: str) -> Counter[int]:
    return Counter(orjson.loads(message.value())["id"] for message in read_committed(bootstrap, topic))


def stored(app: App, store: str) -> dict[tuple[str, str], tuple[int | None, object]]:
    """(expiry or None, value) by (customer, state key), every partition of `store`."""
    entries = {}
    for partition in range(PARTITIONS):
        part = app.state.partition(store, partition)
        part.open()
        try:
            for key, data in part.items():
                if key != STREAM_TIME_KEY:
                    customer, state_key = split_store_key(key)
                    expiry, value = split_expiry(data)
                    entries[(customer.decode(), state_key.decode())] = (expiry, orjson.loads(value))
        finally:
            part.close()
    return entries


def held_in_changelog(bootstrap: str, topic: str) -> set[tuple[str, str]]:
    """Entries whose latest changelog record is a value, not a tombstone."""
    latest: dict[bytes, bytes | None] = {}
    for message in read_committed(bootstrap, topic):
        latest[message.key()] = message.value()
    return {
        (customer.decode(), state_key.decode())
        for key, value in latest.items()
        if key != STREAM_TIME_KEY and value is not None
        for customer, state_key in [split_store_key(key)]
    }


def check(app: App, bootstrap: str, source: str) -> None:
    replayed = replay(bootstrap, source)
    assert let_through(bootstrap, f"{app.name}-orders") == replayed.passed, "each first sighting once"
    assert {customer: total for (customer, _), (_, total) in stored(app, "totals").items()} == replayed.totals
    assert {entry: expiry for entry, (expiry, _) in stored(app, "seen").items()} == replayed.held
    assert held_in_changelog(bootstrap, app.changelog_topic("seen")) == set(replayed.held), "expired: tombstoned"


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_expired_ids_let_an_order_through_again_and_leave_the_store_and_changelog_also_after_a_restore(
    kafka_bootstrap, unique_name, tmp_path, guarantee
):
    rng = random.Random(5)
    source = unique_name("orders")
    create_topic(kafka_bootstrap, source, PARTITIONS)
    produce_timed(kafka_bootstrap, source, orders(1_500, 0, rng))
    name = unique_name("dedup")
    create_topic(kafka_bootstrap, f"{name}-orders", PARTITIONS)
    app = dedup_app(kafka_bootstrap, source, tmp_path, name, guarantee)

    first = app.run_worker(max_seconds=120)

    assert first.stop_reason == "caught_up" and first.total_processed == 1_500
    replayed = replay(kafka_bootstrap, source)
    assert sum(replayed.passed.values()) < 1_500, "some copies were dropped"
    assert any(count > 1 for count in replayed.passed.values()), "some copies came after their id expired"
    check(app, kafka_bootstrap, source)
    config = KafkaClients({"bootstrap.servers": kafka_bootstrap}).topic_config(app.changelog_topic("seen"))
    assert config["cleanup.policy"] == "compact", "expired entries are tombstoned: no deletion by time"

    produce_timed(kafka_bootstrap, source, orders(900, 1_500, rng))
    shutil.rmtree(tmp_path / name)  # a new machine: ids, expiries and stream time come back from the changelog
    restarted = dedup_app(kafka_bootstrap, source, tmp_path, name, guarantee)

    second = restarted.run_worker(max_seconds=120)

    assert second.stop_reason == "caught_up" and second.total_processed == 900
    assert sum(restore.records_applied for restore in second.restores) > 0
    check(restarted, kafka_bootstrap, source)
