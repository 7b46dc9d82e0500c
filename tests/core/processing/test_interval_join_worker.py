"""Interval joins under a real worker and broker: orders joined with their payments, two
co-partitioned topics read in timestamp order, the state deleted between two runs (the second
restores both sides from the aggressively compacted changelog and goes on from the stream position
its commit recorded), judged against the join recomputed from the two topics alone: every pair
once (exactly-once: exactly; at-least-once: none missing), every order without a payment and every
payment without an order sent alone once stream time passed its reach and grace, none sent early.
Also: topics that are not co-partitioned are refused, and bad payments go to the error policy."""

from __future__ import annotations

import random
import shutil
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer
from support.core_helpers import FAST_COMMITS, FAST_GROUP
from support.interval_join_model import outer_join_of
from support.kafka_helpers import create_topic, latest_of, read_committed, read_messages

from dagster_stateful.core import App
from dagster_stateful.core.processing.worker import joined_streams
from dagster_stateful.errors import TopicMismatchError

PARTITIONS = 2
WITHIN, GRACE = 60_000, 5_000
EPOCH = time.time_ns() // 1_000_000 - 36_000_000
"""The first order's time: ten hours ago, so no retention by time deletes the records under test."""
AGGRESSIVE_COMPACTION = {"segment.ms": "300", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "100"}

Result = tuple[str, int | None, int | None]
"""(order key, order id or None, payment id or None)."""


def orders_and_payments(rng: random.Random, count: int) -> tuple[list, list]:
    """(key, value, timestamp) orders 500 ms apart, and payments for most of them 0-90 s later
    (some past the join's minute), a few twice, and a few payments of no order; each topic in
    timestamp order but for disorder within the grace."""
    orders, payments = [], []
    for i in range(count):
        key, at = f"o{i}".encode(), EPOCH + i * 500
        orders.append((key, orjson.dumps({"order": i}), at + rng.randrange(GRACE // 2)))
        for n in range(rng.choice([0, 1, 1, 1, 1, 2])):
            payments.append((key, orjson.dumps({"payment": i * 10 + n}), at + rng.randrange(90_000)))
        if rng.random() < 0.05:
            payments.append((f"x{i}".encode(), orjson.dumps({"payment": -i}), at + rng.randrange(10_000)))
    return orders, sorted(payments, key=lambda payment: payment[2] + rng.randrange(GRACE // 2))


def before_and_after(records: list, cut: int) -> tuple[list, list]:
    """The records earlier than `cut`, and the others (as a source has them before and after a time)."""
    return [r for r in records if r[2] < cut], [r for r in records if r[2] >= cut]


def produce(bootstrap: str, topic: str, records: list) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for key, value, timestamp in records:
        producer.produce(topic, key=key, value=value, timestamp=timestamp)
    assert producer.flush(30) == 0


def recomputed(bootstrap: str, orders: str, payments: str) -> Counter[Result]:
    """The outer join of the two topics as Kafka has them, partition by partition."""
    sides: dict[int, dict[str, list]] = {}
    for side, topic in (("order", orders), ("payment", payments)):
        for message in read_messages(bootstrap, topic):
            value = orjson.loads(message.value())
            record = (message.key().decode(), message.timestamp()[1], value[side])
            sides.setdefault(message.partition(), {"order": [], "payment": []})[side].append(record)
    results: Counter[Result] = Counter()
    for held in sides.values():
        results += outer_join_of(held["order"], held["payment"], 0, WITHIN, GRACE)
    return results


def sent(bootstrap: str, topic: str) -> Counter[Result]:
    results: Counter[Result] = Counter()
    for message in read_committed(bootstrap, topic):
        value = orjson.loads(message.value())
        results[(message.key().decode(), value.get("order"), value.get("payment"))] += 1
    return results


def join_app(bootstrap: str, orders: str, payments: str, state_dir: Path, name: str, guarantee: str) -> App:
    app = App(
        name=name,
        source=orders,
        output=f"{name}-joined",
        stores=["joined"],
        state_dir=state_dir,
        kafka=bootstrap,
        processing_guarantee=guarantee,
        on_error="dead-letter",
        consumer_config=FAST_GROUP,
        changelog_config=AGGRESSIVE_COMPACTION,
        commit_every=50,
        **FAST_COMMITS,
    )
    paid = app.stream(payments, name="payments")
    app.to_topic(app.dataframe().join_interval(paid, before=0, after=WITHIN, grace=GRACE, how="outer"))
    return app


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_an_outer_join_of_orders_and_payments_matches_the_join_recomputed_from_both_topics(
    kafka_bootstrap, unique_name, tmp_path, guarantee, monkeypatch
):
    """With few payments fetched ahead, so that fetching them pauses and resumes all through the runs."""
    monkeypatch.setattr(joined_streams, "PENDING_LIMIT", 40)
    rng = random.Random(29)
    orders, payments = unique_name("orders"), unique_name("payments")
    for topic in (orders, payments):
        create_topic(kafka_bootstrap, topic, PARTITIONS)
    name = unique_name("paid")
    create_topic(kafka_bootstrap, f"{name}-joined", PARTITIONS)
    all_orders, all_payments = orders_and_payments(rng, 600)
    cut = EPOCH + 300 * 500
    (first_orders, more_orders), (first_payments, more_payments) = (
        before_and_after(all_orders, cut),
        before_and_after(all_payments, cut),
    )
    produce(kafka_bootstrap, orders, first_orders)
    produce(kafka_bootstrap, payments, first_payments)
    app = join_app(kafka_bootstrap, orders, payments, tmp_path, name, guarantee)

    first = app.run_worker(max_seconds=120)
    shutil.rmtree(tmp_path / name)
    produce(kafka_bootstrap, orders, more_orders)
    produce(kafka_bootstrap, payments, more_payments)
    second = app.run_worker(max_seconds=120)

    assert first.stop_reason == second.stop_reason == "caught_up"
    assert second.restores, "the second run restored the deleted state from the changelog"
    assert first.late == second.late == 0
    expected, got = recomputed(kafka_bootstrap, orders, payments), sent(kafka_bootstrap, f"{name}-joined")
    kinds = Counter("pair" if o is not None and p is not None else "alone" for _, o, p in expected)
    assert kinds["pair"] > 300 and kinds["alone"] > 50, kinds
    if guarantee == "exactly-once":
        assert got == expected
    else:
        assert set(got) == set(expected), (set(expected) - set(got), set(got) - set(expected))
    assert first.stream_records_joined + second.stream_records_joined >= len(first_payments) + len(more_payments)


def test_a_joined_stream_that_is_not_co_partitioned_is_refused_before_anything_is_processed(
    kafka_bootstrap, unique_name, tmp_path
):
    orders, payments = unique_name("orders"), unique_name("payments")
    create_topic(kafka_bootstrap, orders, 2)
    create_topic(kafka_bootstrap, payments, 3)
    name = unique_name("paid")
    produce(kafka_bootstrap, orders, [(b"o1", orjson.dumps({"order": 1}), EPOCH)])
    app = join_app(kafka_bootstrap, orders, payments, tmp_path, name, "at-least-once")
    with pytest.raises(TopicMismatchError, match=rf"{payments} has 3 partitions.*co-partitioned"):
        app.run_worker(max_seconds=60)


def test_payments_whose_value_or_key_does_not_decode_are_dead_lettered_with_their_topic_partition_and_offset(
    kafka_bootstrap, unique_name, tmp_path
):
    orders, payments = unique_name("orders"), unique_name("payments")
    for topic in (orders, payments):
        create_topic(kafka_bootstrap, topic, 1)
    name = unique_name("paid")
    produce(kafka_bootstrap, orders, [(b"o1", orjson.dumps({"order": 1}), EPOCH)])
    produce(
        kafka_bootstrap,
        payments,
        [
            (b"o1", b"not json", EPOCH + 1),
            (b"\xff\xfe", orjson.dumps({"payment": 11}), EPOCH + 2),
            (b"o1", orjson.dumps({"payment": 10}), EPOCH + 3),
        ],
    )
    app = join_app(kafka_bootstrap, orders, payments, tmp_path, name, "at-least-once")
    report = app.run_worker(max_seconds=60)
    assert report.stop_reason == "caught_up" and report.dead_lettered == 2
    dead, bad_key = sorted(read_messages(kafka_bootstrap, app.dead_letter_topic), key=lambda m: m.offset())
    assert bad_key.key() == b"\xff\xfe"
    assert dict(bad_key.headers() or [])["x-dagster-stateful-source-offset"] == b"1"
    headers = dict(dead.headers() or [])
    assert dead.value() == b"not json"
    assert headers["x-dagster-stateful-source-topic"] == payments.encode()
    assert headers["x-dagster-stateful-source-partition"] == b"0"
    assert headers["x-dagster-stateful-source-offset"] == b"0"
    assert b"joined stream" in headers["x-dagster-stateful-stage"]
    assert sent(kafka_bootstrap, f"{name}-joined") == Counter({("o1", 1, 10): 1})


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_a_table_join_of_two_compacted_topics_ends_with_the_join_of_their_latest_values(
    kafka_bootstrap, unique_name, tmp_path, guarantee
):
    """Customers and their profiles, both compacted tables updated and deleted over two runs (the
    state deleted between them): the output's latest value of each key is the outer join of the two
    tables' latest values, a tombstone where neither side has a value left."""
    rng = random.Random(31)
    compacted = {"cleanup.policy": "compact", **AGGRESSIVE_COMPACTION}
    customers, profiles = unique_name("customers"), unique_name("profiles")
    for topic in (customers, profiles):
        create_topic(kafka_bootstrap, topic, PARTITIONS, compacted)
    name = unique_name("profiled")
    create_topic(kafka_bootstrap, f"{name}-joined", PARTITIONS)
    app = App(
        name=name,
        source=customers,
        output=f"{name}-joined",
        stores=["rows"],
        state_dir=tmp_path,
        kafka=kafka_bootstrap,
        processing_guarantee=guarantee,
        consumer_config=FAST_GROUP,
        changelog_config=AGGRESSIVE_COMPACTION,
        commit_every=30,
        **FAST_COMMITS,
    )
    app.to_topic(app.dataframe().table_join(app.stream(profiles), how="outer", on_merge="keep-left"))

    def updates(count: int, side: str) -> list:
        return [
            (f"c{rng.randrange(40)}".encode(), None if rng.random() < 0.2 else orjson.dumps({side: i}), EPOCH + i)
            for i in range(count)
        ]

    for run in range(2):
        produce(kafka_bootstrap, customers, updates(200, "name"))
        produce(kafka_bootstrap, profiles, updates(200, "tier"))
        report = app.run_worker(max_seconds=120)
        assert report.stop_reason == "caught_up", report
        if run == 0:
            shutil.rmtree(tmp_path / name)
    assert report.restores, "the second run restored the deleted state from the changelog"

    left, right = latest_of(kafka_bootstrap, customers), latest_of(kafka_bootstrap, profiles)
    expected = {
        key: None
        if left.get(key) is None and right.get(key) is None
        else {**(right.get(key) or {}), **(left.get(key) or {})}
        for key in set(left) | set(right)
    }
    got = latest_of(kafka_bootstrap, f"{name}-joined")
    assert {key: value for key, value in got.items() if value is not None} == {
        key: value for key, value in expected.items() if value is not None
    }
    assert set(got) <= set(expected)
