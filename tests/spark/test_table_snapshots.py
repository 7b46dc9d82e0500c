"""Snapshots of a partitioned table's store built by Spark from the table's topic (its changelog),
compacted aggressively, against a real broker.

A snapshot holds the table as the group's last commits left it: per partition, every key's latest
value up to the position the commit recorded (overwritten keys at their last value, deleted keys
absent, updates past the position left out); a partition no commit recorded a position for holds
nothing. A table partition loaded from the snapshot joins the records that follow exactly as a
table read from the topic does, and its worker reads only the topic's records past the snapshot.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

import orjson
import pytest
from confluent_kafka import Message, Producer
from support.core_helpers import FAST_COMMITS, FAST_GROUP
from support.kafka_helpers import create_topic, produce_timed, read_messages, wait_for

from dagster_stateful.core import App
from dagster_stateful.core.kafka.partitioner import partition_of
from dagster_stateful.core.processing.worker.table_partition import TablePartition
from dagster_stateful.core.recovery.table_snapshots import table_snapshots
from dagster_stateful.core.state.directory import TABLES_DIR
from dagster_stateful.errors import ConfigurationError
from dagster_stateful.spark.table_snapshots import snapshot_table
from dagster_stateful.state_table import read_table_state

pytestmark = pytest.mark.spark
PARTITIONS = 3
CUSTOMERS = 30
COMPACT_FAST = {
    "cleanup.policy": "compact",
    "segment.ms": "300",
    "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": "100",
}
ORDERS_AT, LATE_UPDATES_AT, LATER_ORDERS_AT = 100_000, 200_000, 300_000
"""When the orders, the table updates after them and the orders after those happen (ms past t0)."""


@dataclass(frozen=True)
class Written:
    """A table record as the broker stored it."""

    key: bytes
    value: bytes | None
    partition: int
    offset: int


def customer(number: int) -> bytes:
    return f"c{number}".encode()


def partition_of_customer(number: int) -> int:
    """Where librdkafka's default partitioner (which `produce_timed` uses) puts the customer's records."""
    return partition_of(customer(number), PARTITIONS, "consistent")


def write_table(bootstrap: str, topic: str, records: Iterable[tuple[bytes, bytes | None, int]]) -> list[Written]:
    """Produce (key, value, timestamp) records; returns each one's partition and offset."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    written: list[Written] = []
    errors: list[str] = []

    def delivered(error, message: Message) -> None:
        if error is not None:
            errors.append(str(error))
            return
        written.append(Written(message.key(), message.value(), message.partition(), message.offset()))  # type: ignore[arg-type]

    for key, value, timestamp in records:
        producer.produce(topic, key=key, value=value, timestamp=timestamp, on_delivery=delivered)
    assert producer.flush(30) == 0 and not errors, errors
    return written


def versions(first: int, count: int, at: int) -> list[tuple[bytes, bytes | None, int]]:
    """`count` table records from version `first` on, cycling over the customers; every seventh a tombstone."""
    return [
        (
            customer(i % CUSTOMERS),
            None if i % 7 == 3 else orjson.dumps({"tier": f"tier-{i % 5}", "version": i}),
            at + i - first,
        )
        for i in range(first, first + count)
    ]


def table_up_to(written: list[Written], ends: dict[int, int]) -> dict[tuple[int, bytes], bytes]:
    """The table recomputed from every record written below each partition's end: the latest value
    per key, deleted keys absent."""
    latest: dict[tuple[int, bytes], bytes | None] = {}
    for record in sorted(written, key=lambda r: (r.partition, r.offset)):
        if record.offset < ends.get(record.partition, 0):
            latest[(record.partition, record.key)] = record.value
    return {where: value for where, value in latest.items() if value is not None}


def compacted_everywhere(bootstrap: str, topic: str) -> bool:
    """Whether the cleaner removed records from every partition (gaps in the offsets)."""
    kept: dict[int, int] = {}
    ends: dict[int, int] = {}
    for message in read_messages(bootstrap, topic):
        kept[message.partition()] = kept.get(message.partition(), 0) + 1
        ends[message.partition()] = message.offset() + 1
    return len(ends) == PARTITIONS and all(kept[p] < ends[p] for p in ends)


def orders(first: int, customers: Iterable[int], at: int) -> list[tuple[bytes, bytes | None, int]]:
    return [(customer(c), orjson.dumps({"order": first + c, "amount": 1}), at) for c in customers]


def enriched_app(bootstrap: str, source: str, customers: str, name: str, state_dir) -> App:
    app = App(
        name=name,
        source=source,
        output=f"{name}-joined",
        state_dir=state_dir,
        kafka=bootstrap,
        consumer_config=FAST_GROUP,
        **FAST_COMMITS,
    )
    table = app.table(customers, name="customers")
    app.to_topic(app.dataframe().join(table, how="left", on_merge="keep-left"))
    return app


def joined_tiers(bootstrap: str, app: App, first_order: int) -> dict[int, str | None]:
    """Order -> the tier it was sent with, for the orders numbered from `first_order` on."""
    joined = {}
    for message in read_messages(bootstrap, f"{app.name}-joined"):
        value = orjson.loads(message.value())
        if value["order"] >= first_order:
            joined[value["order"]] = value.get("tier")
    return joined


@pytest.fixture
def enriched(kafka_bootstrap, unique_name, tmp_path):
    """Orders joined with a customers table whose topic was compacted while it was written; a worker
    ran, applying the table up to the orders' time, not the updates after them. No order reached
    the partition of the customers in `PARTITIONS - 1`, so no commit there recorded a position."""
    source, customers = unique_name("orders"), unique_name("customers")
    create_topic(kafka_bootstrap, source, PARTITIONS)
    create_topic(kafka_bootstrap, customers, PARTITIONS, COMPACT_FAST)
    t0 = int(time.time() * 1000) - 3_600_000
    written = write_table(kafka_bootstrap, customers, versions(0, 8 * CUSTOMERS, t0))
    rolled = iter(range(8 * CUSTOMERS, 10**6, CUSTOMERS))

    def compacted() -> bool:
        # A new record per partition rolls each active segment once segment.ms has passed, so the
        # cleaner can act on what was written before.
        written.extend(write_table(kafka_bootstrap, customers, versions(next(rolled), CUSTOMERS, t0 + 50_000)))
        return compacted_everywhere(kafka_bootstrap, customers)

    wait_for(compacted, 120, "the cleaner to compact every partition of the table's topic", interval=0.5)
    quiet = PARTITIONS - 1
    ordering = [c for c in range(CUSTOMERS) if partition_of_customer(c) != quiet]
    produce_timed(kafka_bootstrap, source, orders(0, ordering, t0 + ORDERS_AT))
    written += write_table(kafka_bootstrap, customers, versions(10**6, CUSTOMERS, t0 + LATE_UPDATES_AT))
    app = enriched_app(kafka_bootstrap, source, customers, unique_name("enriched"), tmp_path / "state")
    create_topic(kafka_bootstrap, f"{app.name}-joined", PARTITIONS)
    report = app.run_worker(max_seconds=120)
    assert report.stop_reason == "caught_up"
    return app, written, t0, tmp_path


def test_a_table_snapshot_holds_the_table_as_the_last_commits_left_it(spark, kafka_bootstrap, enriched):
    app, written, _, tmp_path = enriched
    topic = app.config.tables["customers"]
    positions = {d.partition: d.committed_position for d in app.describe_tables()}
    snapshots = table_snapshots(str(tmp_path / "snapshots"), app.name, "customers")

    taken = snapshot_table(
        spark,
        app.kafka,
        {"kafka.bootstrap.servers": kafka_bootstrap},
        app.consumer_group,
        app.config.table_stream_topic("customers"),
        topic,
        snapshots,
    )

    quiet = PARTITIONS - 1
    assert positions[quiet] is None, "no order reached that partition: no commit recorded a position"
    topic_ends = {p: high for p, (_, high) in app.kafka.watermarks(topic, range(PARTITIONS)).items()}
    manifest = taken.manifest
    assert manifest.end_offsets == {**positions, quiet: 0}  # the beginning: Kafka Streams restores nothing there
    assert all(manifest.end_offsets[p] < topic_ends[p] for p in range(quiet)), "the late updates are left out"
    expected = table_up_to(written, manifest.end_offsets)
    rows = {
        (partition, key): value
        for partition in range(PARTITIONS)
        for keys, values in snapshots.read_partition(manifest.snapshot_id, partition)
        for key, value in zip(keys, values, strict=True)
    }
    assert rows == expected
    deleted = {(r.partition, r.key) for r in written if r.offset < manifest.end_offsets[r.partition]} - set(expected)
    assert deleted, "some keys' last record below the cut is a tombstone: they are not in the snapshot"
    assert manifest.key_counts == {p: sum(1 for (q, _) in expected if q == p) for p in range(PARTITIONS)}
    assert manifest.sst_image and manifest.extra["committed_table_positions"] == {
        str(p): position for p, position in positions.items()
    }

    table = read_table_state(app, "customers", snapshot_root=snapshots.root).to_pylist()
    assert sorted(table, key=lambda row: (row["partition"], row["key"])) == sorted(
        ({"partition": p, "key": key.decode(), **orjson.loads(value)} for (p, key), value in expected.items()),
        key=lambda row: (row["partition"], row["key"]),
    )


def test_a_table_restored_from_its_snapshot_joins_as_one_read_from_the_topic(
    spark, kafka_bootstrap, unique_name, enriched, caplog
):
    app, written, t0, tmp_path = enriched
    topic = app.config.tables["customers"]
    snapshots = table_snapshots(str(tmp_path / "snapshots"), app.name, "customers")
    manifest = snapshot_table(
        spark,
        app.kafka,
        {"kafka.bootstrap.servers": kafka_bootstrap},
        app.consumer_group,
        app.config.table_stream_topic("customers"),
        topic,
        snapshots,
    ).manifest
    elsewhere = app.bind(state_dir=tmp_path / "elsewhere", snapshot_root=snapshots.root)

    restored = elsewhere.restore_table_partitions("customers")

    assert [(r.partition, r.end_offset, r.records_applied) for r in restored] == [
        (p, manifest.end_offsets[p], manifest.key_counts[p]) for p in range(PARTITIONS)
    ]
    for partition in range(PARTITIONS):
        copy = TablePartition(
            app.partitioned_table("customers"),
            partition,
            elsewhere.app_dir() / TABLES_DIR / "customers" / str(partition),
        )
        stored, _ = copy.open(0)
        try:
            assert stored == (manifest.end_offsets[partition] or None), "the next record to apply is the snapshot's end"
        finally:
            copy.close()

    later = orders(1000, range(CUSTOMERS), t0 + LATER_ORDERS_AT)  # every customer, the quiet partition's too
    produce_timed(kafka_bootstrap, app.source, later)
    with caplog.at_level(logging.INFO, logger="dagster_stateful.core.processing.worker.tables"):
        report = elsewhere.run_worker(max_seconds=120)
    from_topic = enriched_app(kafka_bootstrap, app.source, topic, unique_name("from-topic"), tmp_path / "fresh")
    create_topic(kafka_bootstrap, f"{from_topic.name}-joined", PARTITIONS)
    assert from_topic.run_worker(max_seconds=120).stop_reason == "caught_up"

    assert report.stop_reason == "caught_up"
    final = table_up_to(written, dict.fromkeys(range(PARTITIONS), 10**9))
    expected = {
        1000 + c: orjson.loads(final[(partition_of_customer(c), customer(c))])["tier"]
        if (partition_of_customer(c), customer(c)) in final
        else None
        for c in range(CUSTOMERS)
    }
    assert joined_tiers(kafka_bootstrap, elsewhere, 1000) == expected
    assert joined_tiers(kafka_bootstrap, from_topic, 1000) == expected
    rereads = [r.getMessage() for r in caplog.records if "reading it from offset" in r.getMessage()]
    assert not rereads, "the restored partitions are read on from the snapshot's end, not from the topic's beginning"


def test_a_versioned_table_has_no_snapshots(tmp_path):
    app = App(name="versioned", source="orders", state_dir=tmp_path, kafka="127.0.0.1:9")
    app.table("customers", history=60_000)

    with pytest.raises(ConfigurationError, match=r"is versioned .*declare it without history="):
        app.restore_table_partitions("customers", snapshot_root=str(tmp_path / "snapshots"))
    with pytest.raises(ConfigurationError, match="is versioned"):
        read_table_state(app, "customers", snapshot_root=str(tmp_path / "snapshots"))
