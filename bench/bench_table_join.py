"""CPU per record of a join with a partitioned table, without Kafka: the table's side of the step.

A table partition of `--keys` customers (tier rows, as bench_compare's "join" workload has them)
is written to its RocksDB database and held as a worker holds it; each record of `--records`
orders (keyed by customer, one partition) then goes through what the per-message path does for a
join: the batch's rows read ahead (`PartitionedTables.prefetch`), `PartitionedTables.before` (the
table records due before it: none here, and the joins pointed at it), then the join step (the row
looked up and merged into the order). `--versioned` keeps the table's versions (`history`), so
rows are looked up as of each order's timestamp.
Prints the CPU time per record in microseconds (the thread's, with the cyclic collector paused over
each batch as the worker pauses it), the best of `--repeat` passes over the same records (the later
ones find the rows the table partition keeps in memory), the machine's load, and the settings.

    .venv/bin/python bench/bench_table_join.py
    .venv/bin/python bench/bench_table_join.py --versioned
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Message

from dagster_stateful.core import App
from dagster_stateful.core.gc_pause import gc_paused
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.processing.dsl.joins import table_join_function
from dagster_stateful.core.processing.lifecycle import Deadline
from dagster_stateful.core.processing.paths.bad_input import BadInputHandler
from dagster_stateful.core.processing.worker.table_partition import TablePartition
from dagster_stateful.core.processing.worker.tables import PartitionedTables, TaskTables
from dagster_stateful.core.state import versions

HISTORY_MS = 3_600_000
BATCH = 1_000
"""Records per consumed batch, as the per-message path consumes them; each batch's rows are read
ahead with one multi-get (`PartitionedTables.prefetch`) unless `--no-prefetch`."""


def held_table(state_dir: Path, keys: int, versioned: bool) -> tuple[PartitionedTables, Callable[[Any], Any]]:
    app = App(name="joining", source="orders", stores=["totals"], state_dir=state_dir)
    table = app.table("customers", history=HISTORY_MS if versioned else None)
    app.dataframe().join(table, on_merge="keep-left")
    bad_input = BadInputHandler(app.config.on_error, lambda *_: None, app.config.dead_letter_topic)
    kafka = KafkaClients({"bootstrap.servers": "127.0.0.1:9"})
    tables = PartitionedTables([(table, 0)], app.config, kafka, state_dir, bad_input, Deadline(None))
    partition = TablePartition(table, 0, state_dir / "tables" / "customers" / "0", tables._record)
    partition.open(0)
    assert partition.database is not None
    rows = []
    for k in range(keys):
        row = orjson.dumps({"tier": f"t{k % 8}"})
        rows.append((f"c{k}".encode(), versions.put(None, 1_000, row, HISTORY_MS, 1_000) if versioned else row))
    partition.database.write(rows, {})
    partition.start_at(keys, 1_000)
    task = TaskTables(tables, 0, [partition], stream_time=-1)
    task.by_name = {table.name: partition}
    tables.tasks[0] = task  # as `PartitionedTables.open` holds a partition, without Kafka
    return tables, table_join_function(table, "inner", "keep-left")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--versioned", action="store_true")
    parser.add_argument(
        "--no-prefetch", dest="prefetch", action="store_false", help="look each row up alone (no multi-get per batch)"
    )
    args = parser.parse_args()
    orders = [
        (f"c{(i * 7919) % args.keys}".encode(), {"customer": i, "amount": i % 5}, 2_000 + i)
        for i in range(args.records)
    ]
    batches = [
        [
            Message(topic="orders", partition=0, offset=i, key=key)
            for i, (key, _, _) in enumerate(orders[at : at + BATCH])
        ]
        for at in range(0, len(orders), BATCH)
    ]
    with tempfile.TemporaryDirectory() as directory:
        tables, join = held_table(Path(directory), args.keys, args.versioned)
        best = float("inf")
        for _ in range(args.repeat):
            started = time.thread_time()
            before = tables.before
            for at, batch in zip(range(0, len(orders), BATCH), batches, strict=True):
                with gc_paused():  # as the worker processes a batch
                    if args.prefetch:
                        tables.prefetch(batch, 0)
                    for key, value, timestamp in orders[at : at + BATCH]:
                        before(0, key, timestamp)
                        joined = join(value)
            best = min(best, time.thread_time() - started)
            assert joined["tier"].startswith("t"), "every order joins its row"
    print(
        f"partitioned table join: {best / len(orders) * 1e6:.2f} us/record (best of {args.repeat} passes over "
        f"{len(orders)} records, {args.keys} table keys, {'versioned' if args.versioned else 'plain'} table, "
        f"{'a multi-get per batch of ' + str(BATCH) if args.prefetch else 'one get per record'}; "
        f"load {os.getloadavg()[0]:.2f})"
    )


if __name__ == "__main__":
    main()
