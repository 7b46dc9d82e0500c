"""Where a full restore from the changelog spends its time, and whether writing SST files would help.

A full restore (no local state, no snapshot) must read every changelog record. This script
produces one changelog partition of --keys records in the engine's format (one record per key,
processed-offset header) and measures, on the same data:

1. consume only: the restore consumer's `consume()` loop, touching nothing;
2. consume + fields: the same, reading each record's key, value and headers (the least any
   restore must do: the header says whether the record's message was committed);
3. engine replay: the engine's restore (`Restorer`: per-batch dedup, one WriteBatch per batch
   without the WAL, an atomic flush at the end);
4. SST from the changelog: the alternative design, measured here and not built into the engine:
   consume every record into one dict (last value per key), sort it, write SST files
   (`SortedSstWriter`) and ingest them.

Each line prints records/s and seconds; the store the SST path builds is checked by digest
against the replayed one. The machine and every setting are printed first. What the figures say
(see bench/README.md): the replay runs at about 80% of what consuming the records alone allows, so
no write strategy can make a Python full restore from the changelog much faster; bulk restores
come from snapshots (bench_restore.py).

    .venv/bin/python bench/bench_full_restore.py                 # 3M records
    .venv/bin/python bench/bench_full_restore.py --keys 500000   # a quick run
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from bench_restore import COMMITTED, bench_broker, open_partition, print_machine, produce_changelog
from confluent_kafka import Message, TopicPartition

from dagster_stateful.core.kafka.clients import RESTORE_CONSUMER_CONFIG, KafkaClients
from dagster_stateful.core.monitoring.listeners import Listeners
from dagster_stateful.core.recovery.changelog import Restorer
from dagster_stateful.core.recovery.verification import partition_digest
from dagster_stateful.core.state.rocksdb import SortedSstWriter

TOPIC = "bench-restore-state-changelog"
BATCH = 10_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=3_000_000)
    parser.add_argument("--rounds", type=int, default=2, help="each measurement is repeated; the best is printed")
    arguments = parser.parse_args()
    print_machine()
    print(
        f"settings: {arguments.keys:,} records, best of {arguments.rounds} rounds, restore consumer "
        f"{RESTORE_CONSUMER_CONFIG}"
    )
    with bench_broker("bench-full-restore-") as (bootstrap, work):
        run(arguments, KafkaClients({"bootstrap.servers": bootstrap, "log_level": 0}), bootstrap, work)


def run(arguments: argparse.Namespace, kafka: KafkaClients, bootstrap: str, work: Path) -> None:
    kafka.create_topic(TOPIC, 1, 1, {"cleanup.policy": "compact"})
    produce_changelog(bootstrap, TOPIC, arguments.keys, 1)
    end = kafka.watermarks(TOPIC, [0])[0][1]
    print(f"changelog: {end:,} records in one partition; consume batches of {BATCH:,}")
    measurements: list[tuple[str, Callable[[str], None]]] = [
        ("1. consume only", lambda tag: read_all(kafka, tag, end, touch=False)),
        ("2. consume + key, value, headers", lambda tag: read_all(kafka, tag, end, touch=True)),
        ("3. engine replay (WriteBatch per batch)", lambda tag: replay(kafka, tag, work)),
        ("4. SST files from the changelog", lambda tag: sst_from_changelog(kafka, tag, work, end)),
    ]
    for name, measure in measurements:
        best = min(timed(measure, f"{name[0]}-{round_}") for round_ in range(arguments.rounds))
        print(f"{name}: {end / best:,.0f} records/s ({best:.2f} s)")
    replayed, from_sst = (digest_of(work / f"{path}-0") for path in ("3", "4"))
    assert replayed == from_sst, f"the two restores differ: {replayed} != {from_sst}"
    print("check: the SST-built store has the replayed store's digest")


def digest_of(state_dir: Path) -> str:
    store = open_partition(state_dir, TOPIC, 0)
    try:
        return partition_digest(store).sha256
    finally:
        store.close()


def timed(measure: Callable[[str], None], tag: str) -> float:
    started = time.monotonic()
    measure(tag)
    return time.monotonic() - started


def consume_all(kafka: KafkaClients, tag: str, end: int, each: Callable[[list[Message]], None]) -> None:
    consumer = kafka.consumer({"group.id": f"bench-{tag}", **RESTORE_CONSUMER_CONFIG})
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    read = 0
    try:
        while read < end:
            messages = consumer.consume(BATCH, timeout=0.5)
            each(messages)
            read += len(messages)
    finally:
        consumer.close()


def read_all(kafka: KafkaClients, tag: str, end: int, touch: bool) -> None:
    def fields(messages: list[Message]) -> None:
        if touch:
            for message in messages:
                message.key(), message.value(), message.headers()

    consume_all(kafka, tag, end, fields)


def replay(kafka: KafkaClients, tag: str, work: Path) -> None:
    consumer = kafka.consumer({"group.id": f"bench-{tag}", **RESTORE_CONSUMER_CONFIG})
    store = open_partition(work / tag, TOPIC, 0)
    try:
        Restorer(kafka, consumer, Listeners(), BATCH).restore(store, COMMITTED)
    finally:
        store.close()
        consumer.close()


def sst_from_changelog(kafka: KafkaClients, tag: str, work: Path, end: int) -> None:
    latest: dict[bytes, bytes | None] = {}

    def keep_latest(messages: list[Message]) -> None:
        for message in messages:
            message.headers()  # what a restore must read to tell committed records from the others
            latest[message.key()] = message.value()  # type: ignore[index]

    consume_all(kafka, tag, end, keep_latest)
    writer = SortedSstWriter(work / f"{tag}-sst", "bulk")
    for key in sorted(latest):
        value = latest[key]
        if value is not None:
            writer.put(key, value)
    store = open_partition(work / tag, TOPIC, 0)
    try:
        store.db.ingest_files([file.path for file in writer.finish()])
        store.finish_restore(end, COMMITTED)
    finally:
        store.close()


if __name__ == "__main__":
    main()
