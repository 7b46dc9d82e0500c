"""What the producer's delivery reports cost a commit, and what `delivery.report.only.error` would save.

A worker's commit produces one changelog record per changed key (with the source-offset header) and
waits until all are acknowledged. Its producer calls the engine's `DeliveryTracker` for every
record: the report proves the record was delivered, and the last report of each changelog
partition gives the changelog offset that the commit writes into RocksDB with the data (where a
later restore starts). librdkafka's `delivery.report.only.error=true` would skip the reports of
records delivered well, so the commit would have to learn each partition's offset another way (a
ListOffsets request, trusting that no other producer appended meanwhile).

This script measures the difference on a local broker: --records changelog-like records (keys of
a million customers, 8-byte header, small JSON values, the worker's producer settings: acks=all,
idempotence, linger.ms=5) produced to a topic of --partitions partitions, then flushed, by

- `reports`: the engine's `DeliveryTracker` as `on_delivery` (what the worker does);
- `errors only`: the same, with `delivery.report.only.error=true` (what the worker does now);
- `errors only, no header`: the same records without the source-offset header, which is what a
  changelog format without the header would save on each record.

The variants alternate, --repetitions times each; it prints records/s (produce + flush, wall) and
the CPU seconds of this process per million records, and their medians.

    .venv/bin/python bench/bench_delivery_reports.py                   # 500k records, 3 repetitions
    .venv/bin/python bench/bench_delivery_reports.py --records 2000 --repetitions 1   # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import orjson
from bench_core import create_topic, load, print_machine
from bench_restore import bench_broker
from confluent_kafka import Producer

from dagster_stateful.core.processing.commit.delivery import DeliveryTracker
from dagster_stateful.core.recovery.changelog_format import source_offset_header

VARIANTS = ("reports", "errors only", "errors only, no header")


def produce_all(
    bootstrap: str, topic: str, records: int, only_errors: bool, headers: bool = True
) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, records the tracker saw delivered) to produce and flush `records`."""
    tracker = DeliveryTracker()
    config = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "on_delivery": tracker,
        **({"delivery.report.only.error": True} if only_errors else {}),
    }
    producer = Producer(config)
    keys = [b"\x00\x00\x00\x0ccustomer-%06dtotal" % (i % 1_000_000) for i in range(records)]
    values = [orjson.dumps(i % 977) for i in range(records)]
    started, cpu = time.perf_counter(), time.process_time()
    for i in range(records):
        while True:
            try:
                header = source_offset_header(i) if headers else None
                producer.produce(topic, values[i], keys[i], -1, None, None, 0, header)
                break
            except BufferError:
                producer.poll(0.05)
    left = producer.flush(120)
    wall, used = time.perf_counter() - started, time.process_time() - cpu
    if left or tracker.errors:
        raise SystemExit(f"{left} records undelivered, errors: {tracker.errors[:3]}")
    return wall, used, len(tracker.last_offsets)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()
    print_machine()
    print(f"records: {args.records:,} per run, {args.partitions} partitions; repetitions {args.repetitions}")
    results: dict[str, list[tuple[float, float]]] = {variant: [] for variant in VARIANTS}
    with bench_broker("bench-delivery-") as (bootstrap, _):
        for repetition in range(args.repetitions):
            order = VARIANTS if repetition % 2 == 0 else tuple(reversed(VARIANTS))
            for variant in order:
                topic = f"bench-delivery-{uuid.uuid4().hex[:8]}"
                create_topic(bootstrap, topic, args.partitions)
                only_errors, headers = variant != "reports", variant != "errors only, no header"
                wall, cpu, reported = produce_all(bootstrap, topic, args.records, only_errors, headers)
                results[variant].append((args.records / wall, cpu / args.records * 1e6))
                print(
                    f"  {variant:23s} {args.records / wall:>10,.0f} records/s  {cpu / args.records * 1e6:6.2f} "
                    f"CPU µs/record  (partitions with a reported offset: {reported}; load {load()})"
                )
    print("\n| variant | records/s (median) | CPU µs per record (median) |\n|---|---|---|")
    for variant in VARIANTS:
        rates, cpus = zip(*results[variant], strict=True)
        print(f"| {variant} | {statistics.median(rates):,.0f} | {statistics.median(cpus):.2f} |")


if __name__ == "__main__":
    main()
