"""CPU per record of a re-keying app's source hop (`paths.rekeying.Rekeying.process`), without Kafka.

The hop reads each source record, decodes its value, takes its new key (`group_by("region")`) and
hands the record to the producer (here a function that only counts it), so the figure is the
engine's own cost per record, the part of bench_compare's "group_by" workload that profiles showed
dominant. Orders as bench_compare's (customer, region, amount); `--with-step` adds a stateless step
before `group_by`, which makes the hop encode the value again.

`--join` runs bench_compare's "join" workload's source hop instead: each order joins (inner,
`on_merge="keep-left"`) a partitioned table of `--customers` customers (`{"tier": "t<n>"}` rows in
RocksDB, one database per partition, held as a worker holds them), then `group_by("tier")`. The
orders are spread over `--partitions` partitions by murmur2 of their keys and consumed in runs of
`--run` records of one partition, `--batch` records per batch, as the worker's consumer hands them
over; each batch's table rows are read ahead (`PartitionedTables.refresh`, the table consumer a stub
that says the tables are read to their ends), and the co-partitioning check samples the records.
The passes go over the same records, so that the later ones find the rows kept in memory, as a
worker's run over more orders than customers does. `--producer` hands the records to the commit
path's `Committer.produce` over a real producer (its broker unreachable, its queue large enough to
hold every record) instead of the counting function.

Prints the CPU time of the hop's thread per record in microseconds (its own thread's, so that other
work on the machine and the producer's threads count less than in wall-clock time), the best of
`--repeat` passes over `--records` records, the machine's load, and the settings.

    .venv/bin/python bench/bench_rekeying_hop.py
    .venv/bin/python bench/bench_rekeying_hop.py --records 500000 --with-step
    .venv/bin/python bench/bench_rekeying_hop.py --join
    .venv/bin/python bench/bench_rekeying_hop.py --join --producer
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson
from confluent_kafka import Consumer, Message, Producer, TopicPartition

from dagster_stateful.core import App, Sum
from dagster_stateful.core.gc_pause import gc_paused
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.kafka.partitioner import partition_of
from dagster_stateful.core.processing.commit.committer import Committer
from dagster_stateful.core.processing.commit.delivery import DeliveryTracker
from dagster_stateful.core.processing.lifecycle import Deadline
from dagster_stateful.core.processing.paths.bad_input import BadInputHandler
from dagster_stateful.core.processing.paths.rekeying import Produce, Rekeying
from dagster_stateful.core.processing.worker.batch_routing import partitioned_tables
from dagster_stateful.core.processing.worker.co_partitioning import PlacementCheck
from dagster_stateful.core.processing.worker.table_partition import TablePartition
from dagster_stateful.core.processing.worker.task_tables import TaskTables

UNREACHABLE = "127.0.0.1:9"
TABLE_TIME = 1_000
"""The table rows' timestamp, before every order's."""


class _Counted:
    """A producer that only counts the records it is given."""

    def __init__(self) -> None:
        self.sent = 0

    def __call__(self, *_record: object) -> None:
        self.sent += 1


class _ReadTables:
    """The table consumer's stand-in: every table partition is read to its end (nothing to fetch)."""

    def get_watermark_offsets(self, _partition: TopicPartition, **_options: object) -> tuple[int, int]:
        return 0, 0


def committer_produce(records: int) -> tuple[Produce, Callable[[], int]]:
    """The commit path's `produce` over a real producer whose broker is unreachable (its queue holds
    every record), and a function returning how many records it holds (its own requests counted too)."""
    producer = Producer(
        {
            "bootstrap.servers": UNREACHABLE,
            "queue.buffering.max.messages": 2 * records + 10,
            "queue.buffering.max.kbytes": 2_097_151,
            "linger.ms": 60_000,
            "log_level": 0,
        }
    )
    consumer = Consumer({"bootstrap.servers": UNREACHABLE, "group.id": "bench-hop", "log_level": 0})
    committer = Committer(consumer, producer, DeliveryTracker(), "orders", None)
    return committer.produce, lambda: len(producer)


def hop(state_dir: str, with_step: bool, produce: Produce) -> Rekeying:
    app = App(name="hop", source="orders", stores=["totals"], state_dir=state_dir)
    frame = app.dataframe()
    if with_step:
        frame.apply(lambda order: {**order, "checked": True})
    frame.group_by("region").aggregate(Sum("amount"))
    bad_input = BadInputHandler(app.config.on_error, lambda *_: None, app.config.dead_letter_topic)
    grouping = app._dataframe.grouping
    assert grouping is not None
    rekeying = Rekeying(app.config, grouping, bad_input, produce, {})
    rekeying.take([TopicPartition("orders", 0, 0)], None)
    return rekeying


def joining_hop(state_dir: Path, customers: int, partitions: int, produce: Produce) -> Rekeying:
    """bench_compare's "join" source hop, its table partitions held as `PartitionedTables.open` holds
    them, without Kafka."""
    app = App(name="joining", source="orders", stores=["totals"], state_dir=state_dir)
    table = app.table("customers")
    app.dataframe().join(table, how="inner", on_merge="keep-left").group_by("tier").aggregate(Sum("amount"))
    bad_input = BadInputHandler(app.config.on_error, lambda *_: None, app.config.dead_letter_topic)
    kafka = KafkaClients({"bootstrap.servers": UNREACHABLE})
    _, tables = partitioned_tables(app._dataframe, app.config, kafka, state_dir, bad_input, Deadline(None))
    tables._consumer = _ReadTables()  # type: ignore[assignment]
    tables._placement = PlacementCheck("orders", partitions, rekeyed=False)
    grouping = app._dataframe.grouping
    assert grouping is not None
    rekeying = Rekeying(app.config, grouping, bad_input, produce, {}, tables)
    rekeying.take([TopicPartition("orders", partition, 0) for partition in range(partitions)], None)
    rows: dict[int, list[tuple[bytes, bytes]]] = {partition: [] for partition in range(partitions)}
    for k in range(customers):
        key = f"c{k}".encode()
        rows[partition_of(key, partitions)].append((key, orjson.dumps({"tier": f"t{k % 8}"})))
    for partition in range(partitions):
        held = TablePartition(table, partition, state_dir / "tables" / table.name / str(partition), tables._record)
        held.open(0)
        assert held.database is not None
        held.database.write(rows[partition], {})
        held.start_at(len(rows[partition]), TABLE_TIME)
        task = TaskTables(tables, partition, [held], stream_time=-1)
        task.by_name[table.name] = held
        tables.tasks[partition] = task
        rekeying.positions[partition].tables = task
    return rekeying


def region_orders(records: int) -> list[Message]:
    return [
        Message(
            topic="orders",
            partition=0,
            offset=i,
            key=f"c{i % 1000}".encode(),
            value=orjson.dumps({"customer": f"c{i % 1000}", "region": f"r{i % 7}", "amount": i % 5}),
            timestamp=(1, 1_000 + i),
        )
        for i in range(records)
    ]


def joining_orders(records: int, customers: int, partitions: int, run: int) -> list[Message]:
    """Orders as bench_compare's "join" has them, in runs of `run` records of one partition."""
    by_partition: list[list[tuple[bytes, bytes]]] = [[] for _ in range(partitions)]
    for i in range(records):
        customer = f"c{(i * 7919) % customers}"
        order = orjson.dumps({"customer": customer, "amount": 1 + i % 7, "order": i})
        by_partition[partition_of(customer.encode(), partitions)].append((customer.encode(), order))
    messages: list[Message] = []
    at = [0] * partitions
    while len(messages) < records:
        for partition, orders in enumerate(by_partition):
            for key, value in orders[at[partition] : at[partition] + run]:
                offset = at[partition]
                at[partition] += 1
                messages.append(
                    Message(
                        topic="orders",
                        partition=partition,
                        offset=offset,
                        key=key,
                        value=value,
                        timestamp=(1, 2_000 + len(messages)),
                    )
                )
    return messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--with-step", action="store_true", help="a stateless step before group_by")
    parser.add_argument("--join", action="store_true", help='the "join" workload\'s hop: a partitioned table joined')
    parser.add_argument("--customers", type=int, default=100_000, help="with --join: table rows (order keys)")
    parser.add_argument("--partitions", type=int, default=6, help="with --join")
    parser.add_argument("--run", type=int, default=2_000, help="with --join: records of one partition in a row")
    parser.add_argument("--batch", type=int, default=10_000, help="with --join: records per consumed batch")
    parser.add_argument("--producer", action="store_true", help="produce through Committer.produce (no broker)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as state_dir:
        counted = _Counted()
        produce: Produce = counted
        held: Callable[[], int] = lambda: counted.sent  # noqa: E731 - replaced with --producer
        if args.producer:
            produce, held = committer_produce(args.records * args.repeat)
        if args.join:
            rekeying = joining_hop(Path(state_dir), args.customers, args.partitions, produce)
            records = joining_orders(args.records, args.customers, args.partitions, args.run)
            batch = args.batch
        else:
            rekeying = hop(state_dir, args.with_step, produce)
            records = region_orders(args.records)
            batch = len(records)
        best = float("inf")
        for passed in range(1, args.repeat + 1):
            started = time.thread_time()
            for at in range(0, len(records), batch):
                end = min(at + batch, len(records))
                with gc_paused():  # as the worker processes a batch
                    rekeying.process(records, at, end, end - at)
            best = min(best, time.thread_time() - started)
            assert held() >= passed * len(records), "every record is sent on"
    what = (
        f"join with a partitioned table of {args.customers} rows over {args.partitions} partitions, runs of "
        f"{args.run} records of a partition, batches of {args.batch}"
        if args.join
        else f"step before group_by: {'yes' if args.with_step else 'no'}"
    )
    producer = "Committer.produce, no broker" if args.producer else "a counting function"
    print(
        f"re-keying hop: {best / len(records) * 1e6:.2f} us/record (best of {args.repeat} passes over "
        f"{len(records)} records; {what}; producer: {producer}; load {os.getloadavg()[0]:.2f})"
    )


if __name__ == "__main__":
    main()
