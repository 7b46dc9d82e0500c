"""Benchmark of a windowed aggregation, message by message against folded in columns, on a real broker.

One source topic of --messages JSON orders over --keys keys in --partitions partitions, with event
times --spacing-ms apart (message i at a fixed base plus i * spacing), is processed by a worker
per path with `run_worker(until_caught_up=True)`:

- per-message: `tumbling_window(--window-ms).aggregate(Sum(function of the order)).final()`, a
  Python call per message;
- columns: `tumbling_window(--window-ms).aggregate(Sum("amount")).final()`, folded a consumed batch
  at a time in columns (`core/processing/window_columns.py`).

Both send each closed window to an output topic. Printed per path: messages/s (processed / wall
seconds of run_worker), closed windows sent, and the check: the totals of the windows sent plus
those of the windows still open in the store equal the amounts produced, key by key, and each
closed window was sent once.

    .venv/bin/python bench/bench_windows.py                        # 1M orders, 10k keys, 1 s windows
    .venv/bin/python bench/bench_windows.py --keys 1000 --window-ms 10000
    .venv/bin/python bench/bench_windows.py --messages 200000 --keys 1000
"""

from __future__ import annotations

import argparse
import logging
import time
import uuid
from collections import Counter
from pathlib import Path

import orjson
from bench_core import amount, create_topic, engine_revision, load, order_amount, print_machine, produce_orders
from bench_restore import bench_broker
from confluent_kafka import Consumer, TopicPartition

from dagster_stateful.core import App, Sum
from dagster_stateful.core.state.keys import STREAM_TIME_KEY
from dagster_stateful.core.state.window_state import split_window_key

STORE = "windows"
BASE_MS = (time.time_ns() // 1_000_000_000 - 3600) * 1000
"""Event time of the first order: an hour ago, within the topic's retention (the broker deletes
segments whose records are older than it, event time included)."""
PATHS = ("per-message", "columns")


def make_app(bootstrap: str, source: str, output: str, state_dir: Path, path: str, args: argparse.Namespace) -> App:
    app = App(
        name=f"windows-{path}-{uuid.uuid4().hex[:6]}",
        source=source,
        stores=[STORE],
        state_dir=state_dir,
        kafka=bootstrap,
        commit_interval=args.commit_interval,
    )
    frame = app.dataframe()
    windows = frame.tumbling_window(args.window_ms)
    windows.aggregate(Sum("amount") if path == "columns" else Sum(order_amount), name="total").final()
    app.to_topic(frame, output)
    return app


def read_output(bootstrap: str, topic: str, partitions: int) -> list[tuple[str, int, int]]:
    """(key, window start, total) of every window sent."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}"})
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)}
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    sent: list[tuple[str, int, int]] = []
    positions = dict.fromkeys(range(partitions), 0)
    deadline = time.monotonic() + 900
    while any(positions[p] < ends[p] for p in ends):
        if time.monotonic() > deadline:
            raise SystemExit(f"CHECK FAILED: {topic} not read to its end within 900 s: at {positions}, ends {ends}")
        for message in consumer.consume(10_000, timeout=1):
            partition, offset, value = message.partition(), message.offset(), message.value()
            if message.error() is None and partition is not None and offset is not None and value is not None:
                window = orjson.loads(value)
                sent.append(((message.key() or b"").decode(), window["start"], window["value"]))
                positions[partition] = offset + 1
    consumer.close()
    return sent


def open_windows(app: App, partitions: int, window_ms: int) -> dict[tuple[str, int], int]:
    """The totals of the windows still open in the store (start + size past each partition's stream time)."""
    found: dict[tuple[str, int], int] = {}
    for partition in range(partitions):
        part = app.state.partition(STORE, partition)
        part.open()
        try:
            held = dict(part.items())
        finally:
            part.close()
        stream_time = orjson.loads(held.pop(STREAM_TIME_KEY, b"-1"))
        for key, value in held.items():
            start, customer = split_window_key(key)
            if start + window_ms > stream_time:
                found[(customer.decode(), start)] = orjson.loads(value)
    return found


def check(sent: list[tuple[str, int, int]], still_open: dict[tuple[str, int], int], args: argparse.Namespace) -> str:
    expected: Counter[str] = Counter()
    for i in range(args.messages):
        expected[customer_of(i, args.keys)] += amount(i)
    counted: Counter[str] = Counter()
    for customer, _, total in sent:
        counted[customer] += total
    for (customer, _), total in still_open.items():
        counted[customer] += total
    repeated = sum(seen - 1 for seen in Counter((c, s) for c, s, _ in sent).values())
    if counted != expected or repeated:
        wrong = [customer for customer in expected if counted[customer] != expected[customer]]
        examples = ", ".join(f"{c}: {counted[c]} counted, {expected[c]} expected" for c in wrong[:3])
        raise SystemExit(
            f"CHECK FAILED: {len(wrong)} keys with wrong totals ({examples}; {len(sent):,} windows sent, "
            f"{len(still_open):,} open), {repeated} windows sent more than once"
        )
    return f"ok ({len(expected):,} keys' totals, {len(sent):,} closed windows sent once each)"


def customer_of(i: int, keys: int) -> str:
    return f"customer-{i % keys}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--window-ms", type=int, default=1_000, help="tumbling window size (no grace)")
    parser.add_argument("--spacing-ms", type=float, default=0.1, help="event time between successive orders")
    parser.add_argument("--commit-interval", type=float, default=5.0)
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated: per-message, columns")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print_machine()
    span_s = args.messages * args.spacing_ms / 1000
    print(
        f"settings: {args.messages:,} orders, {args.keys:,} keys, {args.partitions} partitions, tumbling windows of "
        f"{args.window_ms} ms over {span_s:,.0f} s of event time, commit every {args.commit_interval} s, Sum of "
        f"the amount, final(), to an output topic; engine {engine_revision()}"
    )
    with bench_broker("bench-windows-") as (bootstrap, work):
        source = f"orders-{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, source, args.partitions)
        seconds = produce_orders(
            bootstrap,
            source,
            args.messages,
            lambda i: customer_of(i, args.keys),
            lambda i: BASE_MS + int(i * args.spacing_ms),
        )
        print(f"produced in {seconds:.1f} s")
        for path in args.paths.split(","):
            output = f"windows-out-{path}-{uuid.uuid4().hex[:6]}"
            create_topic(bootstrap, output, args.partitions)
            app = make_app(bootstrap, source, output, work / f"state-{path}", path, args)
            began = time.monotonic()
            report = app.run_worker(until_caught_up=True)
            wall = time.monotonic() - began
            print(f"{path}: stopped ({report.stop_reason}) after {report.total_processed:,} messages", flush=True)
            verdict = check(
                read_output(bootstrap, output, args.partitions),
                open_windows(app, args.partitions, args.window_ms),
                args,
            )
            rate = report.total_processed / wall
            print(
                f"{path:>12}: {rate:>9,.0f} msg/s ({report.total_processed:,} in {wall:.1f} s; "
                f"{report.messages_in_columns:,} folded in columns; load {load()}); check {verdict}"
            )


if __name__ == "__main__":
    main()
