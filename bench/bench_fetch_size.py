"""What the worker's consumer fetch settings cost in memory and give in speed.

The worker's consumer takes up to `max.partition.fetch.bytes` from a partition per fetch, and
librdkafka prefetches while the worker processes, until a partition's queue passes its thresholds
(`queued.min.messages`, `queued.max.messages.kbytes`); then it waits `fetch.queue.backoff.ms`
before it looks again. This script runs bench_compare's engine runner (`engine_totals.py`, the
running total per key, the columnar `aggregate(Sum("amount"))` unless --update) on the same topics
of one broker, once per variant (each partition fetch size of --fetch-mib with each backoff of
--queue-backoff-ms) and round, alternating, and prints per workload and variant the median msg/s
and the median peak RSS (`VmHWM`, sampled every 0.1 s) of the worker's process. Every run's totals
are checked against the totals recomputed from the source. The machine and settings are printed first.

    .venv/bin/python bench/bench_fetch_size.py                     # 10k and 1M keys, 4 backoffs, about 5 minutes here
    .venv/bin/python bench/bench_fetch_size.py --fetch-mib 5 2 1 --queue-backoff-ms 20
    .venv/bin/python bench/bench_fetch_size.py --messages 20000 --keys 100 --rounds 1
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import uuid

from bench_compare import Systems, Workload, check_totals, prepare_topic
from bench_restore import bench_broker, print_machine

from dagster_stateful.core.processing.worker.client_settings import FETCH_QUEUE_BACKOFF_MS, PARTITION_FETCH_BYTES

MIB = 1 << 20

Variant = tuple[int, int]
"""A partition fetch size (MiB) and a fetch queue backoff (ms)."""


def describe(variant: Variant) -> str:
    return f"{variant[0]} MiB fetches, {variant[1]} ms queue backoff"


def run_engine(systems: Systems, workload: Workload, variant: Variant, update: bool) -> tuple[float, float]:
    """One bounded worker from the start of the topic to its end: (msg/s, peak RSS MiB)."""
    system = "engine" if update else "engine-aggregate"
    mib, backoff = variant
    options = [
        *("--consumer-setting", f"max.partition.fetch.bytes={mib * MIB}"),
        *("--consumer-setting", f"fetch.queue.backoff.ms={backoff}"),
    ]
    group = f"bench-fetch-{uuid.uuid4().hex[:8]}"
    outcome, peak = systems.run(system, workload, group, workload.messages, restore=False, engine_options=options)
    check_totals(outcome, workload.expected([]), f"the engine with {describe(variant)}")
    return outcome["messages"] / outcome["seconds"], peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, nargs="+", default=[10_000, 1_000_000], help="distinct keys per workload")
    parser.add_argument("--fetch-mib", type=int, nargs="+", default=[PARTITION_FETCH_BYTES // MIB])
    parser.add_argument("--queue-backoff-ms", type=int, nargs="+", default=[1000, 100, 20, 5])
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--commit-interval", type=float, default=5.0, help="seconds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--update", action="store_true", help="the stateful update instead of the aggregation")
    arguments = parser.parse_args()
    print_machine()
    computation = "stateful update" if arguments.update else 'aggregate(Sum("amount"))'
    default = describe((PARTITION_FETCH_BYTES // MIB, FETCH_QUEUE_BACKOFF_MS))
    print(
        f"settings: {arguments.messages:,} orders per workload, {arguments.partitions} partitions, {computation}, "
        f"commit every {arguments.commit_interval:g} s, {arguments.rounds} rounds; the engine's defaults: {default}"
    )
    variants = list(itertools.product(arguments.fetch_mib, arguments.queue_backoff_ms))
    with bench_broker("bench-fetch-size-") as (bootstrap, work):
        systems = Systems(bootstrap, work, arguments)
        for keys in arguments.keys:
            workload = Workload(f"bench-fetch-orders-{uuid.uuid4().hex[:8]}", arguments.messages, keys)
            prepare_topic(bootstrap, workload, arguments)
            runs: dict[Variant, list[tuple[float, float]]] = {variant: [] for variant in variants}
            for _ in range(arguments.rounds):
                for variant in variants:
                    runs[variant].append(run_engine(systems, workload, variant, arguments.update))
            for variant, figures in runs.items():
                rate = statistics.median(rate for rate, _ in figures)
                peak = statistics.median(peak for _, peak in figures)
                each = ", ".join(f"{rate:,.0f}" for rate, _ in figures)
                print(f"{keys:,} keys, {describe(variant)}: {rate:,.0f} msg/s (runs {each}), peak RSS {peak:,.0f} MiB")
    print("check: every run's totals equal the totals recomputed from the source")


if __name__ == "__main__":
    main()
