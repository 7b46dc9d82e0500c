"""Windowed aggregations in a worker, against a real broker with aggressive changelog compaction.

Orders carry event times (the message timestamp) that mostly advance and sometimes lag, some past
the grace period. What the worker emits, keeps and counts as late is compared with `replay`, a
plain recomputation of the windows from the source topic as it was read back from Kafka (per
partition, in offset order): final results once per window (read_committed, under both
guarantees), the windows left in the store (expired ones deleted, and their changelog records
tombstoned), late messages counted or dead-lettered, and all of it again after the local state
is deleted and restored from the changelog alone while more orders arrive.
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
from support.session_model import replay_sessions
from support.sliding_model import replay_sliding

from dagster_stateful.core import Aggregate, App, Count
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.state.window_state import STREAM_TIME_KEY, split_window_key

PARTITIONS = 2
CUSTOMERS = 12
SIZE, GRACE = 10_000, 3_000
EPOCH = (time.time_ns() // 1_000_000 // SIZE - 3_600) * SIZE
"""The first order's event time: ten hours ago, so no retention by time deletes the orders under test."""
AGGRESSIVE_COMPACTION = {"segment.ms": "300", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "100"}

Window = tuple[str, int]
"""(customer, window start)."""


def tally(aggregate: dict, order: dict) -> dict:
    return {"count": aggregate["count"] + 1, "total": aggregate["total"] + order["amount"]}


def empty() -> dict:
    return {"count": 0, "total": 0}


def timed_orders(count: int, start: int, rng: random.Random, max_lag: int = 6_000) -> list[tuple[bytes, bytes, int]]:
    """(key, value, timestamp): event time advancing 150 ms an order, one in ten lagging up to
    `max_lag` ms (some within the 3 s grace period, some past it)."""
    orders = []
    for i in range(start, start + count):
        customer = f"c{rng.randrange(CUSTOMERS)}"
        lag = rng.randrange(max_lag) if rng.random() < 0.1 else 0
        order = {"id": i, "customer": customer, "amount": 1 + i % 7}
        orders.append((customer.encode(), orjson.dumps(order), EPOCH + i * 150 - lag))
    return orders


def produce_timed(bootstrap: str, topic: str, orders: list[tuple[bytes, bytes, int]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for key, value, timestamp in orders:
        producer.produce(topic, key=key, value=value, timestamp=timestamp)
    assert producer.flush(30) == 0


@dataclass
class Replayed:
    """The windows recomputed from the source."""

    final: dict[Window, dict] = field(default_factory=dict)
    """Every closed window's tally."""
    kept: dict[Window, dict] = field(default_factory=dict)
    """Windows not yet expired, with their tallies."""
    late_ids: set[int] = field(default_factory=set)


def replay(bootstrap: str, source: str, step: int = SIZE, retention: int = SIZE + GRACE) -> Replayed:
    """Windows of SIZE every `step` with GRACE and `retention`, stream time per partition, over the
    source as Kafka has it."""
    by_partition: dict[int, list] = {}
    for message in read_messages(bootstrap, source):
        by_partition.setdefault(message.partition(), []).append(message)
    replayed = Replayed()
    for messages in by_partition.values():
        stream_time, windows = -1, dict[Window, dict]()
        for message in sorted(messages, key=lambda m: m.offset()):
            timestamp, order = message.timestamp()[1], orjson.loads(message.value())
            starts = [
                s for s in range(timestamp - timestamp % step - SIZE, timestamp + 1, step) if s <= timestamp < s + SIZE
            ]
            accepted = [s for s in starts if s + SIZE + GRACE > max(stream_time, timestamp)]
            for start in accepted:
                window = (order["customer"], start)
                windows[window] = tally(windows.get(window, empty()), order)
            if not accepted:
                replayed.late_ids.add(order["id"])
            stream_time = max(stream_time, timestamp)
            for window in list(windows):
                if window[1] + SIZE + GRACE <= stream_time:
                    replayed.final.setdefault(window, windows[window])
                if window[1] + retention <= stream_time:
                    del windows[window]
        replayed.kept.update(windows)
    return replayed


def windowed_app(bootstrap: str, source: str, state_dir: Path, name: str, guarantee: str) -> App:
    app = App(
        name=name,
        source=source,
        output=f"{name}-windows",
        stores=["windows"],
        state_dir=state_dir,
        kafka=bootstrap,
        processing_guarantee=guarantee,
        on_error="dead-letter",
        consumer_config=FAST_GROUP,
        changelog_config=AGGRESSIVE_COMPACTION,
        commit_every=100,
        **FAST_COMMITS,
    )
    frame = app.dataframe().tumbling_window(SIZE, grace=GRACE).aggregate(Aggregate(empty, tally), name="tally").final()
    app.to_topic(frame)
    return app


def emitted(bootstrap: str, topic: str) -> list[tuple[Window, dict]]:
    results = []
    for message in read_committed(bootstrap, topic):
        result = orjson.loads(message.value())
        assert result["end"] == result["start"] + SIZE
        results.append(((message.key().decode(), result["start"]), result["value"]))
    return results


def stored(app: App) -> dict[Window, dict]:
    windows = {}
    for partition in range(PARTITIONS):
        part = app.state.partition("windows", partition)
        part.open()
        try:
            for key, value in part.items():
                if key != STREAM_TIME_KEY:
                    start, customer = split_window_key(key)
                    windows[(customer.decode(), start)] = orjson.loads(value)
        finally:
            part.close()
    return windows


def live_in_changelog(bootstrap: str, topic: str) -> set[Window]:
    """Windows whose latest changelog record is a value, not a tombstone."""
    latest: dict[bytes, bytes | None] = {}
    for message in read_committed(bootstrap, topic):
        latest[message.key()] = message.value()
    return {
        (customer.decode(), start)
        for key, value in latest.items()
        if key != STREAM_TIME_KEY and value is not None
        for start, customer in [split_window_key(key)]
    }


def dead_lettered_ids(bootstrap: str, topic: str) -> list[int]:
    ids = []
    for message in read_committed(bootstrap, topic):
        headers = dict(message.headers() or [])
        assert headers["x-dagster-stateful-stage"] == b"late for its windows"
        ids.append(orjson.loads(message.value())["id"])
    return ids


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_final_windows_are_emitted_once_and_expired_ones_leave_the_store_and_changelog_also_after_a_restore(
    kafka_bootstrap, unique_name, tmp_path, guarantee
):
    rng = random.Random(7)
    source = unique_name("orders")
    create_topic(kafka_bootstrap, source, PARTITIONS)
    produce_timed(kafka_bootstrap, source, timed_orders(1_500, 0, rng))
    name = unique_name("windows")
    create_topic(kafka_bootstrap, f"{name}-windows", PARTITIONS)
    app = windowed_app(kafka_bootstrap, source, tmp_path, name, guarantee)

    first = app.run_worker(max_seconds=120)

    replayed = replay(kafka_bootstrap, source)
    assert first.stop_reason == "caught_up" and first.total_processed == 1_500
    assert replayed.late_ids and replayed.final, "the orders make late messages and closed windows"
    assert first.late == len(replayed.late_ids)
    assert sorted(dead_lettered_ids(kafka_bootstrap, f"{name}-dead-letter")) == sorted(replayed.late_ids)
    results = emitted(kafka_bootstrap, f"{name}-windows")
    assert dict(results) == replayed.final and len(results) == len(replayed.final), "each closed window once"
    assert stored(app) == replayed.kept, "closed windows expired (retention = size + grace) and were deleted"
    changelog = app.changelog_topic("windows")
    assert live_in_changelog(kafka_bootstrap, changelog) == set(replayed.kept), "expired windows are tombstoned"
    config = KafkaClients({"bootstrap.servers": kafka_bootstrap}).topic_config(changelog)
    assert config["cleanup.policy"] == "compact,delete" and int(config["retention.ms"]) > SIZE + GRACE

    produce_timed(kafka_bootstrap, source, timed_orders(900, 1_500, rng))
    shutil.rmtree(tmp_path / name)  # a new machine: windows and stream time come back from the changelog
    restarted = windowed_app(kafka_bootstrap, source, tmp_path, name, guarantee)

    second = restarted.run_worker(max_seconds=120)

    replayed = replay(kafka_bootstrap, source)
    assert second.stop_reason == "caught_up" and second.total_processed == 900
    assert sum(restore.records_applied for restore in second.restores) > 0
    assert first.late + second.late == len(replayed.late_ids), "stream time was restored with the windows"
    results = emitted(kafka_bootstrap, f"{name}-windows")
    assert dict(results) == replayed.final and len(results) == len(replayed.final), "each closed window once"
    assert stored(restarted) == replayed.kept


def test_hopping_windows_pass_on_every_update_and_keep_windows_for_their_retention(
    kafka_bootstrap, unique_name, tmp_path
):
    rng = random.Random(11)
    source = unique_name("orders")
    create_topic(kafka_bootstrap, source, PARTITIONS)
    orders = timed_orders(800, 0, rng, max_lag=3 * SIZE)  # a window opens every 5 s: lagging 8 s+ is late
    produce_timed(kafka_bootstrap, source, orders)
    name = unique_name("hopping")
    create_topic(kafka_bootstrap, f"{name}-counts", PARTITIONS)
    app = App(
        name=name,
        source=source,
        output=f"{name}-counts",
        stores=["windows"],
        state_dir=tmp_path,
        kafka=kafka_bootstrap,
        consumer_config=FAST_GROUP,
        changelog_config=AGGRESSIVE_COMPACTION,
        **FAST_COMMITS,
    )
    retention = 4 * SIZE
    hopping = app.dataframe().hopping_window(SIZE, SIZE // 2, grace=GRACE, retention=retention)
    app.to_topic(hopping.aggregate(Count()).current())

    report = app.run_worker(max_seconds=120)

    replayed = replay(kafka_bootstrap, source, step=SIZE // 2, retention=retention)
    assert report.stop_reason == "caught_up" and report.late == len(replayed.late_ids) > 0
    updates: dict[Window, list[int]] = {}
    for message in read_messages(kafka_bootstrap, f"{name}-counts"):
        result = orjson.loads(message.value())
        updates.setdefault((message.key().decode(), result["start"]), []).append(result["value"])
    counts = {window: {**replayed.final, **replayed.kept}[window]["count"] for window in updates}
    assert updates == {window: list(range(1, count + 1)) for window, count in counts.items()}, "each update, in order"
    assert set(updates) == set(replayed.final) | set(replayed.kept)
    kept = {window: tallied["count"] for window, tallied in replayed.kept.items()}
    assert stored(app) == kept, "windows are kept for their retention, then deleted"
    assert any(window in replayed.final for window in kept), "some closed windows are still kept"


def test_session_updates_with_their_merges_rebuild_the_recomputed_sessions_and_the_store_reads_them_back(
    kafka_bootstrap, unique_name, tmp_path
):
    """`.current()` under a real worker: a consumer keeping the latest row per (key, start) and
    dropping the `merged` ones ends with exactly the recomputed sessions, as `read_state` does."""
    gap = 4_000
    rng = random.Random(13)
    source = unique_name("orders")
    create_topic(kafka_bootstrap, source, PARTITIONS)
    produce_timed(kafka_bootstrap, source, timed_orders(1_200, 0, rng))
    name = unique_name("sessions")
    create_topic(kafka_bootstrap, f"{name}-sessions", PARTITIONS)
    app = App(
        name=name,
        source=source,
        output=f"{name}-sessions",
        stores=["visits"],
        state_dir=tmp_path,
        kafka=kafka_bootstrap,
        consumer_config=FAST_GROUP,
        changelog_config=AGGRESSIVE_COMPACTION,
        **FAST_COMMITS,
    )
    retention = 100 * gap  # every session stays readable
    app.to_topic(app.dataframe().session_window(gap, grace=GRACE, retention=retention).aggregate(Count()).current())

    report = app.run_worker(max_seconds=120)

    expected: dict[Window, tuple[int, int]] = {}
    by_partition: dict[int, list[tuple[str, int, object]]] = {}
    for message in read_messages(kafka_bootstrap, source):
        order = orjson.loads(message.value())
        by_partition.setdefault(message.partition(), []).append((order["customer"], message.timestamp()[1], order))
    late = 0
    for records in by_partition.values():
        replayed = replay_sessions(records, gap, GRACE, retention)
        late += len(replayed.late)
        expected.update({sid: (s.end, len(s.values)) for sid, s in replayed.kept.items()})
    assert report.stop_reason == "caught_up" and report.late == late > 0
    rows: dict[Window, tuple[int, int]] = {}
    for message in read_messages(kafka_bootstrap, f"{name}-sessions"):
        customer, result = message.key().decode(), orjson.loads(message.value())
        for start in result["merged"]:
            del rows[(customer, start)]
        rows[(customer, result["start"])] = (result["end"], result["value"])
    assert rows == expected
    with app.read_state("visits") as reader:
        held = {(w.message_key, w.start): (w.end, w.value) for w in reader.windows()}
    assert held == expected
    assert app.store_profile("visits")["holds"] == "sessions"


def test_sliding_window_updates_end_with_the_recomputed_windows_and_the_store_reads_them_back(
    kafka_bootstrap, unique_name, tmp_path
):
    """`.current()` sliding windows under a real worker, run twice (the state deleted between the
    two, so the second restores windows and kept records from the compacted changelog): the latest
    update of each (key, start) is the recomputed window's count, and `read_state` reads the same."""
    difference = 2_000
    rng = random.Random(17)
    source = unique_name("orders")
    create_topic(kafka_bootstrap, source, PARTITIONS)
    produce_timed(kafka_bootstrap, source, timed_orders(800, 0, rng))
    name = unique_name("sliding")
    create_topic(kafka_bootstrap, f"{name}-recent", PARTITIONS)
    app = App(
        name=name,
        source=source,
        output=f"{name}-recent",
        stores=["recent"],
        state_dir=tmp_path,
        kafka=kafka_bootstrap,
        consumer_config=FAST_GROUP,
        changelog_config=AGGRESSIVE_COMPACTION,
        **FAST_COMMITS,
    )
    retention = 1_000 * difference  # every window stays readable
    frame = app.dataframe().sliding_window(difference, grace=GRACE, retention=retention)
    app.to_topic(frame.aggregate(Count()).current())

    first = app.run_worker(max_seconds=120)
    shutil.rmtree(tmp_path / name)
    produce_timed(kafka_bootstrap, source, timed_orders(400, 800, rng))
    second = app.run_worker(max_seconds=120)

    expected: dict[Window, int] = {}
    by_partition: dict[int, list[tuple[str, int, object]]] = {}
    for message in read_messages(kafka_bootstrap, source):
        order = orjson.loads(message.value())
        by_partition.setdefault(message.partition(), []).append((order["customer"], message.timestamp()[1], order))
    late = 0
    for records in by_partition.values():
        replayed = replay_sliding(records, difference, GRACE, retention)
        late += len(replayed.late)
        expected.update({window: len(values) for window, values in replayed.kept.items()})
    assert first.stop_reason == second.stop_reason == "caught_up" and first.late + second.late == late > 0
    assert second.restores, "the second run restored the deleted state from the changelog"
    rows: dict[Window, int] = {}
    for message in read_messages(kafka_bootstrap, f"{name}-recent"):
        result = orjson.loads(message.value())
        assert result["end"] == result["start"] + difference
        rows[(message.key().decode(), result["start"])] = result["value"]
    assert rows == expected
    with app.read_state("recent") as reader:
        held = {(w.message_key, w.start): w.value for w in reader.windows()}
    assert held == expected
    assert app.store_profile("recent")["holds"] == "sliding windows"


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_the_last_windows_of_a_partition_that_went_quiet_close_by_the_wall_clock(
    kafka_bootstrap, unique_name, tmp_path, guarantee
):
    """`final(advance_when_idle=1 s)`: no record comes after the orders, so only the wall clock can
    close the last windows of each partition. Every window recomputed from the source is sent with
    its count (exactly once under exactly-once, read_committed), none other, and a second run sends
    nothing again."""
    rng = random.Random(23)
    source = unique_name("orders")
    create_topic(kafka_bootstrap, source, PARTITIONS)
    produce_timed(kafka_bootstrap, source, timed_orders(300, 0, rng, max_lag=1))  # none late
    name = unique_name("quiet")
    create_topic(kafka_bootstrap, f"{name}-windows", PARTITIONS)
    app = App(
        name=name,
        source=source,
        output=f"{name}-windows",
        stores=["per_window"],
        state_dir=tmp_path,
        kafka=kafka_bootstrap,
        processing_guarantee=guarantee,
        consumer_config=FAST_GROUP,
        changelog_config=AGGRESSIVE_COMPACTION,
        **FAST_COMMITS,
    )
    size = 500  # the clock moves stream time 1 ms a ms: the last window closes within 0.6 s of idleness
    windows = app.dataframe().tumbling_window(size, grace=100).aggregate(Count())
    app.to_topic(windows.final(advance_when_idle=1_000))

    first = app.run_worker(max_seconds=8, until_caught_up=False)
    second = app.run_worker(max_seconds=4, until_caught_up=False)

    expected: Counter[Window] = Counter()
    for message in read_messages(kafka_bootstrap, source):
        timestamp = message.timestamp()[1]
        expected[(message.key().decode(), timestamp - timestamp % size)] += 1
    sent = read_committed(kafka_bootstrap, f"{name}-windows")
    counts = {(m.key().decode(), orjson.loads(m.value())["start"]): orjson.loads(m.value())["value"] for m in sent}
    assert counts == dict(expected), "every window, the last ones closed by the clock"
    assert first.windows_closed_idle > 0 and second.windows_closed_idle == 0
    if guarantee == "exactly-once":
        assert len(sent) == len(expected), "each window once"
