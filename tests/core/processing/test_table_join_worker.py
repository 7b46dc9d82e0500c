"""Stream-table joins with partitioned tables, against a real broker: orders keyed by customer joined
with the customers table on the message key. A versioned table gives the value as of each order's
timestamp, also for table updates that arrive after the orders they must join (within the grace),
and across runs and a lost state directory; a plain table takes the two topics in timestamp order;
a table record that does not decode goes to the error policy, one in an open transaction waits for
its commit; topics that are not co-partitioned,
or a table topic that is not compacted, are refused before anything is processed."""

from __future__ import annotations

import shutil
import time

import orjson
import pytest
from confluent_kafka import Producer
from support.core_helpers import FAST_COMMITS, FAST_GROUP
from support.kafka_helpers import create_topic, produce_timed, read_committed, read_messages

from dagster_stateful.core import App, Sum
from dagster_stateful.errors import ConfigurationError, TopicMismatchError

PARTITIONS = 3
CUSTOMERS = 30
TIERS = ("bronze", "silver", "gold", "platinum")
GRACE_MS = 60_000
COMPACT_FAST = {
    "cleanup.policy": "compact",
    "segment.ms": "300",
    "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": "100",
}
KEEP_VERSIONS = {**COMPACT_FAST, "min.compaction.lag.ms": str(24 * 3600 * 1000)}
"""A versioned table's topic keeps versions younger than its history (Kafka Streams asks the same)."""


def customer(number: int) -> bytes:
    return f"c{number}".encode()


def tier_updates(version: int, at: int) -> list[tuple[bytes, bytes | None, int]]:
    """Every customer's tier as of `at` (ms): version N gives customer c the tier N + c."""
    return [
        (customer(c), orjson.dumps({"tier": TIERS[(version + c) % len(TIERS)], "version": version}), at)
        for c in range(CUSTOMERS)
    ]


def order_batch(first: int, at: int) -> list[tuple[bytes, bytes | None, int]]:
    """One order per customer, keyed by the customer, numbered from `first`, all at `at` (ms)."""
    return [(customer(c), orjson.dumps({"order": first + c, "amount": 1 + c % 3}), at) for c in range(CUSTOMERS)]


def order_number(value: bytes | None) -> int:
    assert value is not None
    return orjson.loads(value)["order"]


def as_of(table: list[tuple[bytes, bytes | None, int]], key: bytes, at: int) -> str | None:
    """The tier the table's records give `key` at `at`: its newest version no later (recomputed)."""
    versions = sorted((ts, value) for k, value, ts in table if k == key and ts <= at)
    return None if not versions or versions[-1][1] is None else orjson.loads(versions[-1][1])["tier"]


def joined(bootstrap: str, topic: str, guarantee: str) -> dict[int, list[str | None]]:
    """Order -> every tier it was sent with (as a read_committed reader sees it under exactly-once)."""
    seen: dict[int, list[str | None]] = {}
    read = read_committed if guarantee == "exactly-once" else read_messages
    for message in read(bootstrap, topic):
        value = orjson.loads(message.value())
        seen.setdefault(value["order"], []).append(value.get("tier"))
    return seen


def tiers_app(bootstrap, source, customers, state_dir, name, history, grace, how="inner", **settings) -> App:
    app = App(
        name=name,
        source=source,
        output=f"{name}-joined",
        state_dir=state_dir,
        kafka=bootstrap,
        consumer_config=FAST_GROUP,
        **FAST_COMMITS,
        **settings,
    )
    table = app.table(customers, name="customers", history=history)
    app.to_topic(app.dataframe().join(table, how=how, on_merge="keep-left", grace=grace))
    return app


def check(outputs: dict[int, list[str | None]], expected: dict[int, str | None], guarantee: str) -> None:
    assert set(outputs) == set(expected), f"missing {sorted(set(expected) - set(outputs))[:10]}"
    for order, tiers in outputs.items():
        assert set(tiers) == {expected[order]}, f"order {order} joined {tiers}, expected {expected[order]}"
        if guarantee == "exactly-once":
            assert len(tiers) == 1, f"order {order} sent {len(tiers)} times"


@pytest.mark.parametrize(("guarantee", "lose_state"), [("at-least-once", False), ("exactly-once", True)])
def test_a_versioned_table_joins_each_order_as_of_its_timestamp_even_when_updates_arrive_late(
    kafka_bootstrap, unique_name, tmp_path, guarantee, lose_state
):
    source, customers, name = unique_name("orders"), unique_name("customers"), unique_name("versioned")
    create_topic(kafka_bootstrap, source, PARTITIONS)
    create_topic(kafka_bootstrap, customers, PARTITIONS, KEEP_VERSIONS)
    create_topic(kafka_bootstrap, f"{name}-joined", PARTITIONS)
    t0 = int(time.time() * 1000) - 3_600_000
    table = tier_updates(0, t0)
    produce_timed(kafka_bootstrap, customers, table)
    early, late = order_batch(0, t0 + 10_000), order_batch(100, t0 + 30_000)
    produce_timed(kafka_bootstrap, source, early + late)
    update = tier_updates(1, t0 + 20_000)  # arrives after the orders at t0 + 30 s that must see it
    produce_timed(kafka_bootstrap, customers, update)
    table += update
    advancing = order_batch(200, t0 + 100_000)  # stream time passes the grace of the orders before
    produce_timed(kafka_bootstrap, source, advancing)
    app = tiers_app(
        kafka_bootstrap, source, customers, tmp_path, name, 3_600_000, GRACE_MS, processing_guarantee=guarantee
    )

    first = app.run_worker(max_seconds=120)

    expected = {order_number(value): as_of(table, key, ts) for key, value, ts in early + late}
    assert first.stop_reason == "caught_up"
    check(joined(kafka_bootstrap, f"{name}-joined", guarantee), expected, guarantee)
    assert set(expected.values()) >= {TIERS[0], TIERS[1]}  # both versions were joined

    update = tier_updates(2, t0 + 90_000)  # late again, for the orders still waiting at t0 + 100 s
    produce_timed(kafka_bootstrap, customers, update)
    table += update
    produce_timed(kafka_bootstrap, source, order_batch(300, t0 + 200_000))
    if lose_state:
        shutil.rmtree(tmp_path / name)
    second = app.run_worker(max_seconds=120)

    expected |= {order_number(value): as_of(table, key, ts) for key, value, ts in advancing}
    assert second.stop_reason == "caught_up"
    check(joined(kafka_bootstrap, f"{name}-joined", guarantee), expected, guarantee)
    assert {expected[200 + c] for c in range(CUSTOMERS)} == {TIERS[(2 + c) % len(TIERS)] for c in range(CUSTOMERS)}


def test_a_plain_table_and_its_stream_are_taken_in_timestamp_order(kafka_bootstrap, unique_name, tmp_path):
    """Both topics are complete before the worker starts: only timestamp order gives each order the
    version that was current at its time (reading the table first would give every order the last)."""
    source, customers, name = unique_name("orders"), unique_name("customers"), unique_name("plain")
    create_topic(kafka_bootstrap, source, PARTITIONS)
    create_topic(kafka_bootstrap, customers, PARTITIONS, COMPACT_FAST)
    create_topic(kafka_bootstrap, f"{name}-joined", PARTITIONS)
    t0 = int(time.time() * 1000) - 3_600_000
    table = tier_updates(0, t0) + tier_updates(1, t0 + 20_000) + tier_updates(2, t0 + 40_000)
    broken = (customer(3), b"{not json", t0 + 45_000)
    produce_timed(kafka_bootstrap, customers, [*table, broken])
    orders = order_batch(0, t0 + 10_000) + order_batch(100, t0 + 30_000) + order_batch(200, t0 + 50_000)
    produce_timed(kafka_bootstrap, source, orders)
    app = tiers_app(kafka_bootstrap, source, customers, tmp_path, name, None, 0, how="left", on_error="skip")

    report = app.run_worker(max_seconds=120)

    expected = {order_number(value): as_of(table, key, ts) for key, value, ts in orders}
    assert report.stop_reason == "caught_up" and report.skipped == 1  # the table record that does not decode
    check(joined(kafka_bootstrap, f"{name}-joined", "at-least-once"), expected, "at-least-once")


def tier_totals(table: list[tuple[bytes, bytes | None, int]], orders: list[tuple[bytes, bytes | None, int]]):
    """The amount of the orders per tier their customer had at each order's time (recomputed)."""
    totals: dict[str, int] = {}
    for key, value, ts in orders:
        tier = as_of(table, key, ts)
        if tier is not None and value is not None:
            totals[tier] = totals.get(tier, 0) + orjson.loads(value)["amount"]
    return totals


def last_totals(bootstrap: str, topic: str) -> dict[str, int]:
    """The last total each tier was sent with (a read_committed reader's view)."""
    last: dict[str, int] = {}
    for message in sorted(read_committed(bootstrap, topic), key=lambda m: (m.partition(), m.offset())):
        last[message.key().decode()] = orjson.loads(message.value())
    return last


@pytest.mark.parametrize(("guarantee", "lose_state"), [("at-least-once", False), ("exactly-once", True)])
def test_orders_joined_with_the_table_before_group_by_are_totalled_per_tier(
    kafka_bootstrap, unique_name, tmp_path, guarantee, lose_state
):
    """Kafka Streams' `join(KTable).groupBy().aggregate()`: the orders, keyed by customer, join the
    customers table beside the source's partitions (three), then go per tier through a repartition
    topic of two partitions. Each order counts for the tier its customer had at its time, across two
    runs (the second after table updates, and once with the state directory deleted)."""
    source, customers, name = unique_name("orders"), unique_name("customers"), unique_name("tiers")
    create_topic(kafka_bootstrap, source, PARTITIONS)
    create_topic(kafka_bootstrap, customers, PARTITIONS, COMPACT_FAST)
    create_topic(kafka_bootstrap, f"{name}-totals", 2)
    t0 = int(time.time() * 1000) - 3_600_000
    table = tier_updates(0, t0) + tier_updates(1, t0 + 20_000)
    produce_timed(kafka_bootstrap, customers, table)
    orders = order_batch(0, t0 + 10_000) + order_batch(100, t0 + 30_000)
    produce_timed(kafka_bootstrap, source, orders)
    app = App(
        name=name,
        source=source,
        output=f"{name}-totals",
        stores=["totals"],
        state_dir=tmp_path,
        kafka=kafka_bootstrap,
        consumer_config=FAST_GROUP,
        changelog_config=COMPACT_FAST,
        processing_guarantee=guarantee,
        **FAST_COMMITS,
    )
    joined_table = app.table(customers, name="customers")
    tiers = app.dataframe().join(joined_table, on_merge="keep-left").group_by("tier", partitions=2)
    app.to_topic(tiers.aggregate(Sum("amount"), name="total"))

    first = app.run_worker(max_seconds=120)

    assert first.stop_reason == "caught_up" and first.total_lag == 0
    assert last_totals(kafka_bootstrap, f"{name}-totals") == tier_totals(table, orders)
    assert first.table_records_applied >= len(table) - CUSTOMERS  # the versions before the last orders

    update, later = tier_updates(2, t0 + 40_000), order_batch(200, t0 + 50_000)
    produce_timed(kafka_bootstrap, customers, update)
    produce_timed(kafka_bootstrap, source, later)
    table, orders = table + update, orders + later
    if lose_state:
        shutil.rmtree(tmp_path / name)
    second = app.run_worker(max_seconds=120)

    assert second.stop_reason == "caught_up" and second.total_lag == 0
    assert last_totals(kafka_bootstrap, f"{name}-totals") == tier_totals(table, orders)
    described = {(row.table, row.partition): row for row in app.describe_tables()}
    assert {row.committed_position for row in described.values()} != {None}
    assert all(row.records_not_applied == 0 and row.position_valid for row in described.values())


def test_joins_that_cannot_work_are_refused_before_processing(kafka_bootstrap, unique_name, tmp_path):
    source, name = unique_name("orders"), unique_name("refused")
    create_topic(kafka_bootstrap, source, PARTITIONS)
    wrong_count, not_compacted = unique_name("customers4"), unique_name("customers-deleted")
    create_topic(kafka_bootstrap, wrong_count, PARTITIONS + 1, COMPACT_FAST)
    create_topic(kafka_bootstrap, not_compacted, PARTITIONS)

    app = tiers_app(kafka_bootstrap, source, wrong_count, tmp_path, name, None, 0)
    with pytest.raises(TopicMismatchError, match=r"co-partitioned.*group_by\(\.\.\., partitions=4\)"):
        app.run_worker(max_seconds=30)
    app = tiers_app(kafka_bootstrap, source, not_compacted, tmp_path, f"{name}-2", None, 0)
    with pytest.raises(TopicMismatchError, match=r"cleanup\.policy=delete"):
        app.run_worker(max_seconds=30)

    placed_apart = unique_name("customers-crc32")
    create_topic(kafka_bootstrap, placed_apart, PARTITIONS, COMPACT_FAST)
    produce_timed(kafka_bootstrap, placed_apart, tier_updates(0, int(time.time() * 1000)))  # librdkafka's default
    produce_timed(
        kafka_bootstrap, source, [(f"o{i}".encode(), orjson.dumps({"customer": f"c{i}"}), 0) for i in range(30)]
    )
    app = App(name=f"{name}-4", source=source, state_dir=tmp_path, kafka=kafka_bootstrap, consumer_config=FAST_GROUP)
    app.dataframe().group_by("customer").join(app.table(placed_apart, name="customers"))
    with pytest.raises(TopicMismatchError, match=r"place keys differently.*murmur2_random"):
        app.run_worker(max_seconds=60)  # the repartition topic places the customers as murmur2 does

    app = App(name=f"{name}-3", source=source, state_dir=tmp_path, kafka=kafka_bootstrap)
    plain = app.table(not_compacted, name="plain")
    with pytest.raises(ConfigurationError, match="needs a versioned table"):
        app.dataframe().join(plain, grace=1000)
    with pytest.raises(ConfigurationError, match="joins on the message key"):
        app.dataframe().join(plain, on="customer")
    versioned = app.table(not_compacted, name="versioned", history=60_000)
    with pytest.raises(ConfigurationError, match=r"with a grace .* cannot come before group_by"):
        app.dataframe().join(versioned, grace=1000).group_by("tier")


def test_a_table_update_in_an_open_transaction_waits_for_its_commit(kafka_bootstrap, unique_name, tmp_path):
    """A table written by a transactional producer (another exactly-once app, say): the worker reads
    up to the transaction left open, joins what is committed, and does not wait on the rest."""
    source, customers, name = unique_name("orders"), unique_name("customers"), unique_name("open-txn")
    create_topic(kafka_bootstrap, source, PARTITIONS)
    create_topic(kafka_bootstrap, customers, PARTITIONS, COMPACT_FAST)
    create_topic(kafka_bootstrap, f"{name}-joined", PARTITIONS)
    t0 = int(time.time() * 1000) - 3_600_000
    table = tier_updates(0, t0)
    produce_timed(kafka_bootstrap, customers, table)
    writer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": unique_name("table-writer")})
    writer.init_transactions(30)
    writer.begin_transaction()
    for key, value, _ in tier_updates(1, t0 + 1_000):
        writer.produce(customers, key=key, value=value, timestamp=t0 + 1_000)
    writer.flush(30)  # delivered, never committed while the worker runs
    orders = order_batch(0, t0 + 10_000)
    produce_timed(kafka_bootstrap, source, orders)
    app = tiers_app(kafka_bootstrap, source, customers, tmp_path, name, None, 0, processing_guarantee="exactly-once")

    try:
        report = app.run_worker(max_seconds=60)
    finally:
        writer.abort_transaction(30)

    expected = {order_number(value): as_of(table, key, ts) for key, value, ts in orders}
    assert report.stop_reason == "caught_up"
    check(joined(kafka_bootstrap, f"{name}-joined", "exactly-once"), expected, "exactly-once")
