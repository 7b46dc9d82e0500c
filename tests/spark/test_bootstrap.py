"""Bootstrapping a store from state computed in batch, against the real broker and local Spark.

Spark computes each customer's total for the first part of the orders topic from an archived copy
(Parquet); `bootstrap_store` makes those totals the store's state at the position where the copy
ends; workers process the rest. The final totals must equal a recompute over the whole topic
(nothing lost, nothing doubled) under both guarantees, with the changelog compacted aggressively,
and a restore from the snapshot and one from the changelog alone both give the bootstrapped state.
A store bootstrapped at a moment (from an Arrow table) starts where the broker's offsets-for-times
puts that moment: its worker processes exactly the messages timestamped from then on. A bootstrap
is refused while the app's group has a member, and for positions that miss a partition or leave
its range, writing nothing.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import orjson
import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer
from faults.counting_worker import COMPACT_FAST
from pyspark.sql import functions as F
from support.core_helpers import expected_totals, totals_app, totals_in_store
from support.kafka_helpers import create_topic, read_messages, wait_for

from dagster_stateful.core.config import ProcessingGuarantee
from dagster_stateful.core.state_tables.bootstrap import BootstrapReport
from dagster_stateful.errors import StateTableError
from dagster_stateful.state_table import bootstrap_store

pytestmark = pytest.mark.spark
PARTITIONS, CUSTOMERS = 3, 30
SEED = int(os.environ.get("FAULT_SEED") or random.randrange(2**32))
"""The orders' seed: every failure message names it, and FAULT_SEED=<seed> replays it."""


def orders(rng: random.Random, start: int, count: int) -> list[tuple[bytes, bytes]]:
    made = []
    for i in range(start, start + count):
        customer = f"c{rng.randrange(CUSTOMERS)}"
        made.append((customer.encode(), orjson.dumps({"id": i, "customer": customer, "amount": rng.randint(1, 50)})))
    return made


def produce_as_java_producers_do(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    """Keyed records partitioned by murmur2 (Kafka's default partitioner; librdkafka's `murmur2_random`)."""
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "enable.idempotence": True})
    for key, value in records:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0


def produce_at(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]], first_ms: int) -> None:
    """As `produce_as_java_producers_do`, the records timestamped one millisecond apart from `first_ms`."""
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "enable.idempotence": True})
    for i, (key, value) in enumerate(records):
        producer.produce(topic, key=key, value=value, timestamp=first_ms + i)
    assert producer.flush(30) == 0


def archived_totals(spark, bootstrap: str, source: str, ends: dict[int, int], archive: str):
    """Archive the source up to `ends` as Parquet, then compute each customer's total from the archive."""
    (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("assign", orjson.dumps({source: list(ends)}).decode())
        .option("startingOffsets", "earliest")
        .option("endingOffsets", orjson.dumps({source: {str(p): end for p, end in ends.items()}}).decode())
        .load()
        .select(
            F.col("key").cast("string").alias("customer"), F.col("value").cast("string").alias("order"), "partition"
        )
        .write.parquet(archive)
    )
    amount = F.get_json_object("order", "$.amount").cast("long")
    return (
        spark.read.parquet(archive)
        .groupBy("customer", "partition")
        .agg(F.sum(amount).alias("value"))
        .select(F.col("customer").alias("key"), F.lit("total").alias("state_key"), "value", "partition")
    )


@pytest.mark.parametrize("guarantee", [ProcessingGuarantee.AT_LEAST_ONCE, ProcessingGuarantee.EXACTLY_ONCE])
def test_a_store_bootstrapped_from_spark_totals_then_processed_onward_holds_the_full_recompute(
    spark, kafka_bootstrap, unique_name, tmp_path, guarantee
):
    rng = random.Random(SEED)
    replay = f"FAULT_SEED={SEED}"
    source = unique_name("orders")
    create_topic(kafka_bootstrap, source, partitions=PARTITIONS)
    first, rest = orders(rng, 0, 1200), orders(rng, 1200, 600)
    produce_as_java_producers_do(kafka_bootstrap, source, first)
    app = totals_app(
        kafka_bootstrap,
        source,
        tmp_path / "state",
        unique_name("totals"),
        processing_guarantee=guarantee,
        changelog_config=COMPACT_FAST,
        snapshot_root=str(tmp_path / "snapshots"),
    )
    cut = {p: high for p, (_, high) in app.kafka.watermarks(source, range(PARTITIONS)).items()}
    produce_as_java_producers_do(kafka_bootstrap, source, rest)
    table = archived_totals(spark, kafka_bootstrap, source, cut, str(tmp_path / "archive"))

    report = bootstrap_store(app, "totals", table, cut)

    assert isinstance(report, BootstrapReport) and report.rows == len(expected_totals(first)), replay
    for method in ("snapshot", "changelog"):
        elsewhere = app.bind(state_dir=tmp_path / f"restored-{method}")
        elsewhere.restore_partitions(range(PARTITIONS), from_scratch=True, method=method)
        assert totals_in_store(elsewhere, PARTITIONS) == expected_totals(first), f"{replay}: restored by {method}"
    worker = app.run_worker(max_seconds=120)
    assert worker.total_processed == len(rest), f"{replay}: the worker processes only what came after the cut"
    assert totals_in_store(app, PARTITIONS) == expected_totals(first + rest), f"{replay}: {guarantee.value}"


def test_a_store_bootstrapped_at_a_moment_processes_the_messages_from_that_moment_on(
    kafka_bootstrap, unique_name, tmp_path
):
    rng = random.Random(SEED)
    source = unique_name("orders")
    create_topic(kafka_bootstrap, source, partitions=PARTITIONS)
    first, rest = orders(rng, 0, 600), orders(rng, 600, 300)
    moment = datetime.now(UTC) - timedelta(minutes=10)
    moment_ms = int(moment.timestamp() * 1000)
    produce_at(kafka_bootstrap, source, first, moment_ms - 60_000)
    produce_at(kafka_bootstrap, source, rest, moment_ms)
    app = totals_app(kafka_bootstrap, source, tmp_path / "state", unique_name("totals"), snapshot_root=str(tmp_path))
    totals = expected_totals(first)
    table = pa.table({"key": list(totals), "state_key": ["total"] * len(totals), "value": list(totals.values())})

    joining = {"bootstrap.servers": kafka_bootstrap, "group.id": app.consumer_group, "enable.auto.commit": False}
    member = Consumer(joining)
    member.subscribe([source])
    wait_for(lambda: (member.poll(0.2), member.assignment())[1], 60, "a worker-like member to join the group")
    with pytest.raises(StateTableError, match=r"has 1 member\(s\) .*: stop its workers before bootstrapping"):
        bootstrap_store(app, "totals", table, moment)
    member.close()
    with pytest.raises(StateTableError, match=r"gives offsets for partitions \[0\]; .* give one offset for each"):
        bootstrap_store(app, "totals", table, {0: 0})
    with pytest.raises(StateTableError, match=r"offset 5000 for partition 1 of .* give an offset in that range"):
        bootstrap_store(app, "totals", table, {0: 0, 1: 5_000, 2: 0})
    report = bootstrap_store(app, "totals", table, moment)  # nothing written by the refused ones

    before = Counter(m.partition() for m in read_messages(kafka_bootstrap, source) if m.timestamp()[1] < moment_ms)
    assert report.source_positions == {p: before[p] for p in range(PARTITIONS)}, f"FAULT_SEED={SEED}"
    worker = app.run_worker(max_seconds=120)
    assert worker.total_processed == len(rest), f"FAULT_SEED={SEED}: only the messages from the moment on"
    assert totals_in_store(app, PARTITIONS) == expected_totals(first + rest), f"FAULT_SEED={SEED}"


def test_a_store_with_state_is_refused_unless_replaced_and_a_replacement_removes_the_keys_it_lacks(
    spark, kafka_bootstrap, unique_name, tmp_path
):
    source = unique_name("orders")
    create_topic(kafka_bootstrap, source, partitions=PARTITIONS)
    app = totals_app(kafka_bootstrap, source, tmp_path / "state", unique_name("totals"), snapshot_root=str(tmp_path))
    start = dict.fromkeys(range(PARTITIONS), 0)
    both = spark.createDataFrame([("a", "total", 5), ("b", "total", 7)], "key string, state_key string, value long")
    bootstrap_store(app, "totals", both, start)

    with pytest.raises(StateTableError, match=r"already has state .*replace=True"):
        bootstrap_store(app, "totals", both, start)
    report = bootstrap_store(app, "totals", both.where("key = 'a'"), start, replace=True)

    assert report.tombstones == 1
    app.restore_partitions(range(PARTITIONS), from_scratch=True, method="changelog")
    assert totals_in_store(app, PARTITIONS) == {"a": 5}, "the changelog no longer holds b"
