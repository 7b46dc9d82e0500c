"""How long creating a topic takes until every partition answers, with the engine's first pause and a longer one.

A worker's first start creates its changelog topics (`KafkaClients.create_topic`), and the creation
returns before the new partitions serve requests: the call then asks for their offsets until all
answer, pausing between tries. The first pause is `NEW_TOPIC_FIRST_PAUSE` (20 ms); the admin calls'
usual first pause (100 ms) is the other variant. This script creates --topics compacted topics of
--partitions partitions on a local broker per variant, alternating, and prints each variant's
median seconds and every run.

    .venv/bin/python bench/bench_new_topic.py
    .venv/bin/python bench/bench_new_topic.py --topics 2     # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from bench_core import print_machine
from bench_restore import bench_broker

from dagster_stateful.core.kafka import clients
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.kafka.retrying import BACKOFF_FIRST

VARIANTS = {"engine (first pause 20 ms)": clients.NEW_TOPIC_FIRST_PAUSE, "first pause 100 ms": BACKOFF_FIRST}


def create_one(kafka: KafkaClients, partitions: int) -> float:
    """Seconds to create one compacted topic until every partition answers."""
    started = time.perf_counter()
    kafka.create_topic(f"bench-new-{uuid.uuid4().hex[:8]}", partitions, -1, {"cleanup.policy": "compact"})
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=8, help="topics created per variant")
    parser.add_argument("--partitions", type=int, default=6)
    args = parser.parse_args()
    print_machine()
    print(f"topics: {args.topics} per variant, {args.partitions} partitions each, compacted")
    seconds: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    with bench_broker("bench-new-topic-") as (bootstrap, _):
        kafka = KafkaClients({"bootstrap.servers": bootstrap})
        create_one(kafka, args.partitions)  # the admin client's connection, made once
        for _ in range(args.topics):
            for variant, pause in VARIANTS.items():
                clients.NEW_TOPIC_FIRST_PAUSE = pause
                seconds[variant].append(create_one(kafka, args.partitions))
    print("\n| variant | seconds until every partition answers (median) | runs |\n|---|---|---|")
    for variant, runs in seconds.items():
        print(f"| {variant} | {statistics.median(runs):.3f} | {', '.join(f'{run:.3f}' for run in runs)} |")


if __name__ == "__main__":
    main()
