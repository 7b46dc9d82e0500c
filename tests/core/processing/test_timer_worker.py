"""Timers under real workers and a real broker: orders not paid within a minute of event time
(`support.core_helpers.unpaid_orders_app`), judged against the unpaid orders recomputed from the
source topic. Timers fire once per due time under exactly-once and at least once under
at-least-once: across a worker's stop and another machine's restore from the changelog, after a
crash in the middle of a commit, and by the wall clock in a partition whose source went quiet."""

from __future__ import annotations

import os
import random
import time
from collections import Counter

import orjson
import pytest
from support.commit_crash import crash_mid_commit
from support.core_helpers import PAYMENT_DUE_MS, unpaid_orders_app
from support.kafka_helpers import create_topic, read_committed, read_messages

from dagster_stateful.core.kafka.clients import KafkaClients

PARTITIONS = 2
AGGRESSIVE_COMPACTION = {"segment.ms": "300", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "100"}
TIMER_SEED = int(os.environ.get("TIMER_SEED", random.SystemRandom().randrange(2**32)))

Event = tuple[bytes, bytes, int]
"""(order id, event, timestamp)."""
START_MS = time.time_ns() // 1_000_000 - 3 * 3_600_000
"""Event times start three hours ago: old enough to be past, young enough that the broker's time
retention deletes none of the records."""


def events(count: int, rng: random.Random, start_ms: int, first_id: int = 0) -> list[Event]:
    """Orders `first_id` on, every 0.1-3 s of event time, two in three paid 1 s to 2 min after
    (some late: unpaid first), a few events out of order."""
    produced: list[tuple[int, bytes, dict]] = []
    clock = start_ms
    for order in range(first_id, first_id + count):
        clock += rng.randint(100, 3_000)
        key = f"order-{order}".encode()
        produced.append((clock, key, {"type": "order", "id": order, "time": clock}))
        if rng.random() < 2 / 3:
            paid = clock + rng.randint(1_000, 2 * PAYMENT_DUE_MS)
            produced.append((paid, key, {"type": "payment", "id": order, "time": paid}))
    produced.sort(key=lambda event: event[0] + rng.randint(0, 500))
    return [(key, orjson.dumps(value), timestamp) for timestamp, key, value in produced]


def produce(bootstrap: str, topic: str, batch: list[Event]) -> None:
    producer = KafkaClients({"bootstrap.servers": bootstrap}).producer()
    for key, value, timestamp in batch:
        producer.produce(topic, key=key, value=value, timestamp=timestamp)
    assert producer.flush(30) == 0


def recomputed_unpaid(bootstrap: str, source: str) -> list[int]:
    """The orders whose timer fires, by the source alone (see `recomputed`)."""
    return recomputed(bootstrap, source)[0]


def recomputed(bootstrap: str, source: str) -> tuple[list[int], list[int]]:
    """The orders whose timer fires, and those still waiting for their payment, by the source
    alone: per partition in offset order, stream time the largest timestamp so far; after each
    event, the timers due at stream time fire."""
    by_partition: dict[int, list] = {}
    for message in read_messages(bootstrap, source):
        by_partition.setdefault(message.partition(), []).append(message)
    unpaid: list[int] = []
    waiting: list[int] = []
    for messages in by_partition.values():
        stream_time, due = -1, {}
        for message in sorted(messages, key=lambda m: m.offset()):
            event = orjson.loads(message.value())
            if event["type"] == "order":
                due[event["id"]] = event["time"] + PAYMENT_DUE_MS
            else:
                due.pop(event["id"], None)
            stream_time = max(stream_time, message.timestamp()[1])
            for order in sorted(o for o, at in due.items() if at <= stream_time):
                unpaid.append(order)
                del due[order]
        waiting += due
    return sorted(unpaid), sorted(waiting)


def sent_unpaid(bootstrap: str, topic: str) -> Counter[int]:
    return Counter(orjson.loads(message.value())["unpaid"] for message in read_committed(bootstrap, topic))


def judged(sent: Counter[int], expected: list[int], exactly_once: bool) -> None:
    missing = sorted(set(expected) - set(sent))
    unexpected = sorted(set(sent) - set(expected))
    assert not missing and not unexpected, (
        f"TIMER_SEED={TIMER_SEED}: missing {missing[:10]}, unexpected {unexpected[:10]}"
    )
    if exactly_once:
        doubled = sorted(order for order, seen in sent.items() if seen > 1)
        assert not doubled, f"TIMER_SEED={TIMER_SEED}: fired more than once: {doubled[:10]}"


def new_topics(bootstrap: str, unique_name) -> tuple[str, str]:
    source, name = unique_name("payments"), unique_name("unpaid")
    create_topic(bootstrap, source, PARTITIONS)
    create_topic(bootstrap, f"{name}-unpaid", PARTITIONS)
    return source, name


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_unpaid_orders_are_sent_when_their_timer_fires_also_after_the_partitions_moved_to_another_machine(
    kafka_bootstrap, unique_name, tmp_path, guarantee
):
    rng = random.Random(TIMER_SEED)
    source, name = new_topics(kafka_bootstrap, unique_name)
    produce(kafka_bootstrap, source, events(400, rng, START_MS))
    settings = {"processing_guarantee": guarantee, "changelog_config": AGGRESSIVE_COMPACTION, "commit_every": 50}

    first = unpaid_orders_app(kafka_bootstrap, source, tmp_path / "a", name, **settings).run_worker(max_messages=250)
    later = events(200, rng, START_MS + 2_000_000, first_id=400)
    produce(kafka_bootstrap, source, [event for event in later if event[2] < START_MS + 2_200_000])  # some wait
    moved = unpaid_orders_app(kafka_bootstrap, source, tmp_path / "b", name, **settings)  # restores from the changelog
    second = moved.run_worker(max_seconds=120)

    assert first.stop_reason == "max_messages" and second.stop_reason == "caught_up"
    assert sum(restore.records_applied for restore in second.restores) > 0, "timers came back from the changelog"
    assert first.timers_fired > 0 and second.timers_fired > 0
    judged(
        sent_unpaid(kafka_bootstrap, f"{name}-unpaid"),
        recomputed_unpaid(kafka_bootstrap, source),
        guarantee == "exactly-once",
    )
    with moved.read_state("pending") as reader:
        waiting = sorted(entry.value["id"] for entry in reader.items())
    assert waiting == recomputed(kafka_bootstrap, source)[1] != [], "the orders still waiting, and only they"


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_timers_fired_in_a_commit_that_crashed_fire_again_and_are_sent(
    kafka_bootstrap, unique_name, tmp_path, guarantee
):
    """The first worker dies in its first commit (at-least-once: every record delivered, the source
    offsets not committed; exactly-once: the transaction never committed): its firings are redone."""
    rng = random.Random(TIMER_SEED)
    source, name = new_topics(kafka_bootstrap, unique_name)
    produce(kafka_bootstrap, source, events(300, rng, START_MS))
    settings = {"processing_guarantee": guarantee, "producer_config": {"transaction.timeout.ms": 10_000}}

    crash_mid_commit(
        tmp_path,
        factory="unpaid_orders_app",
        settings=settings,
        changelog_config=AGGRESSIVE_COMPACTION,
        bootstrap=kafka_bootstrap,
        source=source,
        state_dir=str(tmp_path / "crashed"),
        name=name,
    )
    report = unpaid_orders_app(
        kafka_bootstrap, source, tmp_path / "next", name, changelog_config=AGGRESSIVE_COMPACTION, **settings
    ).run_worker(max_seconds=120)

    assert report.stop_reason == "caught_up" and report.timers_fired > 0
    judged(
        sent_unpaid(kafka_bootstrap, f"{name}-unpaid"),
        recomputed_unpaid(kafka_bootstrap, source),
        guarantee == "exactly-once",
    )


def test_wall_clock_timers_fire_in_a_partition_whose_source_went_quiet(kafka_bootstrap, unique_name, tmp_path):
    source, name = new_topics(kafka_bootstrap, unique_name)
    now = time.time_ns() // 1_000_000
    orders = [
        (
            f"order-{i}".encode(),
            orjson.dumps(
                {"type": "order", "id": i, "time": now - PAYMENT_DUE_MS + 2_000 * (i % 3), "wall_clock": True}
            ),
            now,
        )
        for i in range(12)
    ]  # due now, in 2 s and in 4 s of the clock; no event comes after them
    produce(kafka_bootstrap, source, orders)
    app = unpaid_orders_app(kafka_bootstrap, source, tmp_path, name, processing_guarantee="exactly-once")

    report = app.run_worker(max_seconds=8, until_caught_up=False)

    sent = read_committed(kafka_bootstrap, f"{name}-unpaid")
    fired = {orjson.loads(m.value())["unpaid"]: orjson.loads(m.value()) for m in sent}
    assert sorted(fired) == list(range(12)) and len(sent) == 12, "each once, by the clock, with no event after them"
    assert all(result["wall_clock"] for result in fired.values())
    assert report.timers_fired == 12
