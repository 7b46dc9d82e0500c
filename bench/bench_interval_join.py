"""Throughput of an interval join of two streams: orders joined with their payments under a real worker.

`--orders` orders (keyed by order id, 1 ms of event time apart) go to one topic and, for all but
one in ten, a payment (the same key, 0-`--pay-within` ms later) to a second, co-partitioned one
(`--partitions` each), both written before the run. One bounded worker (`join_interval(payments,
before=0, after=--within, grace=--grace, how="left")`, per message, the join's store with its
changelog) reads both until caught up, sending each pair and each order unpaid within the join's
reach to an output topic. Prints records per second (orders and payments) over the run, the
results sent against those recomputed from the two topics (the run fails on a mismatch), peak RSS,
the machine's load, and the settings. Starts a broker of its own unless KAFKA_BOOTSTRAP_SERVERS
names one.

    .venv/bin/python bench/bench_interval_join.py
    .venv/bin/python bench/bench_interval_join.py --orders 500000 --guarantee exactly-once
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import time
import uuid
from pathlib import Path

import orjson
from bench_kafka_streams import build_app, run_java
from bench_restore import bench_broker, print_machine
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from dagster_stateful.core import App
from dagster_stateful.local_kafka.broker import find_java

EPOCH = time.time_ns() // 1_000_000 - 10 * 3_600_000
"""The first order's event time: ten hours ago, inside every topic's retention."""


def produce(bootstrap: str, orders: str, payments: str, count: int, pay_within: int, seed: int) -> int:
    """The orders and their payments, each topic in timestamp order; returns the payments written."""
    rng = random.Random(seed)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,  # a retried batch never lands after a later one (its orders would be late)
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 2_000_000,
        }
    )
    paid = []
    for i in range(count):
        key = b"o%d" % i
        producer.produce(orders, key=key, value=orjson.dumps({"order": i, "amount": 1 + i % 7}), timestamp=EPOCH + i)
        if rng.random() < 0.9:
            paid.append((EPOCH + i + rng.randrange(pay_within), key, i))
        producer.poll(0)
    paid.sort()
    for at, key, i in paid:
        producer.produce(payments, key=key, value=orjson.dumps({"paid": i}), timestamp=at)
        producer.poll(0)
    assert producer.flush(120) == 0
    return len(paid)


def create(bootstrap: str, topics: list[str], partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics(
        [NewTopic(t, num_partitions=partitions, replication_factor=1) for t in topics]
    ).values():
        future.result(30)


def count_sent(bootstrap: str, topic: str, partitions: int) -> tuple[int, int]:
    """(pairs, orders sent alone) in the output topic, read_committed up to its end (past the last
    transaction's marker)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench-reader", "isolation.level": "read_committed"}
    )
    assigned = [TopicPartition(topic, p, 0) for p in range(partitions)]
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)}
    consumer.assign(assigned)
    pairs = alone = 0
    while any(ends[at.partition] > 0 and at.offset < ends[at.partition] for at in consumer.position(assigned)):
        for message in consumer.consume(10_000, timeout=1.0):
            if message.error() is None:
                value = orjson.loads(message.value() or b"{}")
                pairs += "paid" in value
                alone += "paid" not in value
    consumer.close()
    return pairs, alone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--orders", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--within", type=int, default=60_000, help="ms after an order its payment joins it")
    parser.add_argument("--pay-within", type=int, default=66_000, help="payments come 0 to this many ms later")
    parser.add_argument("--grace", type=int, default=1_000)
    parser.add_argument("--guarantee", default="at-least-once")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--runs", type=int, default=1, help="runs of each system (the median is compared)")
    parser.add_argument("--no-kafka-streams", action="store_true", help="run the engine only")
    parser.add_argument("--java-heap", default="2g")
    args = parser.parse_args()
    print_machine()
    print(
        f"settings: {args.orders:,} orders 1 ms apart, 90% paid 0-{args.pay_within:,} ms later, {args.partitions} "
        f"partitions, join_interval(before=0, after={args.within:,}, grace={args.grace:,}, how='left'), "
        f"{args.guarantee}, per message, changelog on"
    )
    with bench_broker("bench-interval-join-") as (bootstrap, work):
        run(args, bootstrap, work)


def run(args: argparse.Namespace, bootstrap: str, work: Path) -> None:
    run_id = uuid.uuid4().hex[:6]
    orders, payments = f"bench-orders-{run_id}", f"bench-payments-{run_id}"
    create(bootstrap, [orders, payments], args.partitions)
    paid = produce(bootstrap, orders, payments, args.orders, args.pay_within, args.seed)
    records = args.orders + paid
    expected_pairs, expected_alone = expected(bootstrap, orders, payments, args)
    print(f"recomputed: {expected_pairs:,} pairs, {expected_alone:,} orders alone, {records:,} records")
    class_path = None if args.no_kafka_streams else build_app()
    engine_rates, streams_rates = [], []
    for index in range(args.runs):
        engine_rates.append(run_engine(args, bootstrap, work, index, orders, payments, records, expected_pairs))
        if class_path is not None:
            streams_rates.append(run_streams(args, bootstrap, work, index, class_path, orders, payments, records))
    engine = sorted(engine_rates)[len(engine_rates) // 2]
    line = f"median: engine {engine:,.0f} records/s"
    if streams_rates:
        streams = sorted(streams_rates)[len(streams_rates) // 2]
        line += f", Kafka Streams {streams:,.0f} records/s: {engine / streams:.2f}x"
    print(line)


def run_engine(
    args: argparse.Namespace,
    bootstrap: str,
    work: Path,
    index: int,
    orders: str,
    payments: str,
    records: int,
    expected_pairs: int,
) -> float:
    output = f"{orders}-paid-engine-{index}"
    create(bootstrap, [output], args.partitions)
    app = App(
        name=f"{orders}-paid-{index}",
        source=orders,
        output=output,
        stores=["paid"],
        state_dir=work / f"state-{index}",
        kafka=bootstrap,
        processing_guarantee=args.guarantee,
    )
    app.to_topic(
        app.dataframe().join_interval(app.stream(payments), before=0, after=args.within, grace=args.grace, how="left")
    )
    app.provision()
    started = time.monotonic()
    report = app.run_worker(max_seconds=3_600)
    seconds = time.monotonic() - started
    pairs, alone = count_sent(bootstrap, output, args.partitions)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"engine run {index + 1}: {records / seconds:,.0f} records/s ({records:,} in {seconds:.1f} s, "
        f"{report.stop_reason}, {report.late} late, {report.stream_records_joined:,} joined-stream records, "
        f"{report.rebalances} rebalances, {report.transactions_aborted} aborted); {pairs:,} pairs, {alone:,} alone; "
        f"peak RSS {rss:,.0f} MiB; "
        f"load {os.getloadavg()[0]:.1f}"
    )
    if pairs < expected_pairs or (args.guarantee == "exactly-once" and pairs != expected_pairs):
        raise SystemExit(f"the engine sent {pairs:,} pairs, {expected_pairs:,} recomputed")
    return records / seconds


def run_streams(
    args: argparse.Namespace,
    bootstrap: str,
    work: Path,
    index: int,
    class_path: str,
    orders: str,
    payments: str,
    records: int,
) -> float:
    output = f"{orders}-paid-streams-{index}"
    create(bootstrap, [output], args.partitions)
    guarantee = "exactly_once_v2" if args.guarantee == "exactly-once" else "at_least_once"
    command = [
        find_java(),
        f"-Xmx{args.java_heap}",
        "-cp",
        class_path,
        "IntervalJoin",
        bootstrap,
        orders,
        payments,
        output,
        f"{orders}-paid-streams-{index}",
        guarantee,
        "5000",
        str(args.within),
        str(args.grace),
        str(records),
        str(work / f"streams-{index}"),
    ]
    java = run_java(command)
    found = [line for line in java.stdout.splitlines() if line.startswith("RESULT ")]
    if java.returncode != 0 or not found:
        raise SystemExit(f"the Kafka Streams app failed ({java.returncode}): {(java.stdout + java.stderr)[-2000:]}")
    fields = dict(item.split("=") for item in found[0].split()[1:])
    seconds = float(fields["seconds"])
    pairs, alone = count_sent(bootstrap, output, args.partitions)
    print(
        f"Kafka Streams run {index + 1}: {records / seconds:,.0f} records/s ({records:,} in {seconds:.1f} s); "
        f"{pairs:,} pairs, {alone:,} alone; peak RSS {java.peak_rss_mib or 0:,.0f} MiB; "
        f"load {os.getloadavg()[0]:.1f}"
    )
    return records / seconds


def expected(bootstrap: str, orders: str, payments: str, args: argparse.Namespace) -> tuple[int, int]:
    """(pairs, orders alone) recomputed: one key per order, so a pair per payment in reach."""
    times: dict[str, dict[bytes, list[int]]] = {orders: {}, payments: {}}
    stream_time: dict[int, int] = {}
    partition_of: dict[bytes, int] = {}
    for topic in (orders, payments):
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-expect"})
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(args.partitions)
        }
        consumer.assign([TopicPartition(topic, p, 0) for p in range(args.partitions)])
        left = sum(ends.values())
        while left:
            for message in consumer.consume(10_000, timeout=1.0):
                if message.error() is None:
                    at, partition, key = message.timestamp()[1], message.partition() or 0, message.key() or b""
                    times[topic].setdefault(key, []).append(at)
                    partition_of[key] = partition
                    stream_time[partition] = max(stream_time.get(partition, -1), at)
                    left -= 1
        consumer.close()
    pairs = alone = 0
    for key, (at,) in times[orders].items():
        joined = sum(1 for paid_at in times[payments].get(key, []) if at <= paid_at <= at + args.within)
        pairs += joined
        alone += joined == 0 and at + args.within + args.grace < stream_time[partition_of[key]]
    return pairs, alone


if __name__ == "__main__":
    main()
