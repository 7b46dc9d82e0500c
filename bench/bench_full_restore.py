"""Where a full restore from the changelog spends its time, and what writing SST files gains.

A full restore (no local state, no snapshot) must read every changelog record. This script
produces one changelog partition of --keys records in the engine's format (one record per key,
processed-offset header) and measures, on the same data:

1. consume only: the restore consumer's `consume()` loop, touching nothing;
2. consume + fields: the same, reading each record's key, value and headers (the least any
   restore must do: the header says whether the record's message was committed);
3. replay through WriteBatches: the engine's restore as a partial restore runs it (per-batch
   dedup, one WriteBatch per batch without the WAL, an atomic flush at the end), forced here by
   giving the empty store a changelog position of 0;
4. the engine's full restore: the same reading, the last value per key gathered over chunks of
   `FULL_RESTORE_CHUNK_RECORDS` keys, each chunk written as sorted SST files and ingested;
5. the same, below the changelog end the group's last commit recorded (`commit_metadata`): no
   record's header is read.

Each line prints records/s and seconds, then the SST files each restored store holds (the
WriteBatch path leaves memtable flushes that RocksDB still has to compact); the two stores are
checked by digest against each other.

Then the parallel replay of a restore run (`recovery.parallel_replay`): a changelog of
--parallel-partitions partitions holding --keys records in all is restored from scratch by 1 and
by 2 processes (--processes), each partition's store checked by digest against the first run's.
The machine and every setting are printed first. See bench/README.md for one run's figures.

    .venv/bin/python bench/bench_full_restore.py                 # 3M records
    .venv/bin/python bench/bench_full_restore.py --keys 500000   # a quick run
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from bench_restore import COMMITTED, STORE, bench_broker, open_partition, print_machine, produce_changelog
from confluent_kafka import Message, TopicPartition

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import RESTORE_CONSUMER_CONFIG, KafkaClients
from dagster_stateful.core.monitoring.listeners import Listeners
from dagster_stateful.core.recovery.changelog_replay import FULL_RESTORE_CHUNK_RECORDS
from dagster_stateful.core.recovery.parallel_replay import replay_partitions
from dagster_stateful.core.recovery.restorer import Restorer
from dagster_stateful.core.recovery.verification import partition_digest
from dagster_stateful.core.state.directory import StateDirectory

TOPIC = "bench-restore-state-changelog"
PARALLEL_APP = "bench-parallel-restore"
PARALLEL_TOPIC = AppConfig(name=PARALLEL_APP, source="bench-source", stores=(STORE,)).changelog_topic(STORE)
BATCH = 10_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=3_000_000)
    parser.add_argument("--rounds", type=int, default=2, help="each measurement is repeated; the best is printed")
    parser.add_argument("--parallel-partitions", type=int, default=4, help="changelog partitions replayed in parallel")
    parser.add_argument("--processes", default="1,2", help="process counts of the parallel replay")
    parser.add_argument(
        "--key-order",
        choices=("shuffled", "ascending"),
        default="shuffled",
        help="the changelog's keys shuffled (seed 1), as a worker's commits write them, or in ascending order",
    )
    arguments = parser.parse_args()
    print_machine()
    print(
        f"settings: {arguments.keys:,} records, best of {arguments.rounds} rounds, restore consumer "
        f"{RESTORE_CONSUMER_CONFIG}, full-restore chunk {FULL_RESTORE_CHUNK_RECORDS:,} keys, keys {arguments.key_order}"
    )
    with bench_broker("bench-full-restore-") as (bootstrap, work):
        kafka = KafkaClients({"bootstrap.servers": bootstrap, "log_level": 0})
        run(arguments, kafka, bootstrap, work)
        run_parallel(arguments, kafka, bootstrap, work)


def run(arguments: argparse.Namespace, kafka: KafkaClients, bootstrap: str, work: Path) -> None:
    kafka.create_topic(TOPIC, 1, 1, {"cleanup.policy": "compact"})
    produce_changelog(bootstrap, TOPIC, arguments.keys, 1, shuffle_seed=shuffle_seed(arguments))
    end = kafka.watermarks(TOPIC, [0])[0][1]
    print(f"changelog: {end:,} records in one partition; consume batches of {BATCH:,}")
    measurements: list[tuple[str, Callable[[str], None]]] = [
        ("1. consume only", lambda tag: read_all(kafka, tag, end, touch=False)),
        ("2. consume + key, value, headers", lambda tag: read_all(kafka, tag, end, touch=True)),
        ("3. replay through WriteBatches", lambda tag: replay(kafka, tag, work, as_partial=True)),
        ("4. the engine's full restore (SST chunks)", lambda tag: replay(kafka, tag, work, as_partial=False)),
        (
            "5. the same below the last commit's recorded end (no headers read)",
            lambda tag: replay(kafka, tag, work, as_partial=False, committed_end=end),
        ),
    ]
    for name, measure in measurements:
        best = min(timed(measure, f"{name[0]}-{round_}") for round_ in range(arguments.rounds))
        print(f"{name}: {end / best:,.0f} records/s ({best:.2f} s)")
    for row in ("3", "4", "5"):
        files = sorted((work / f"{row}-0").rglob("*.sst"))
        size = sum(file.stat().st_size for file in files)
        print(f"row {row}'s store on disk right after the restore: {len(files)} SST files, {size / 2**20:,.0f} MiB")
    replayed, from_sst, below_end = (digest_of(work / f"{path}-0") for path in ("3", "4", "5"))
    assert replayed == from_sst == below_end, f"the restores differ: {replayed}, {from_sst}, {below_end}"
    print("check: the SST-built stores have the WriteBatch-built store's digest")


def run_parallel(arguments: argparse.Namespace, kafka: KafkaClients, bootstrap: str, work: Path) -> None:
    partitions = list(range(arguments.parallel_partitions))
    kafka.create_topic(PARALLEL_TOPIC, len(partitions), 1, {"cleanup.policy": "compact"})
    produce_changelog(bootstrap, PARALLEL_TOPIC, arguments.keys, len(partitions), shuffle_seed=shuffle_seed(arguments))
    marks = kafka.watermarks(PARALLEL_TOPIC, partitions, committed=True)
    records = sum(high - low for low, high in marks.values())
    print(f"parallel replay: {records:,} records in {len(partitions)} partitions, restore batches of {BATCH:,}")
    digests: dict[int, str] | None = None
    for processes in (int(count) for count in arguments.processes.split(",")):
        seconds, found = min(
            (
                parallel_replay(kafka, work / f"parallel-{processes}-{round_}", partitions, marks, processes)
                for round_ in range(arguments.rounds)
            ),
            key=lambda timed_run: timed_run[0],
        )
        print(f"{processes} process(es): {records / seconds:,.0f} records/s ({seconds:.2f} s)")
        assert digests is None or found == digests, f"{processes} process(es) restored other state"
        digests = found
    print("check: every run's stores have the first run's digests")


def shuffle_seed(arguments: argparse.Namespace) -> int | None:
    return 1 if arguments.key_order == "shuffled" else None


def parallel_replay(
    kafka: KafkaClients, state_dir: Path, partitions: list[int], marks: dict[int, tuple[int, int]], processes: int
) -> tuple[float, dict[int, str]]:
    state = StateDirectory(state_dir, AppConfig(name=PARALLEL_APP, source="bench-source", stores=(STORE,)))
    stores = {partition: state.partition(STORE, partition) for partition in partitions}
    for store in stores.values():
        store.open()
    try:
        started = time.monotonic()
        replay_partitions(
            kafka, "bench-parallel", stores, dict.fromkeys(partitions, COMMITTED), marks, processes, BATCH
        )
        seconds = time.monotonic() - started
        return seconds, {partition: partition_digest(store).sha256 for partition, store in stores.items()}
    finally:
        for store in stores.values():
            store.close()


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


def replay(kafka: KafkaClients, tag: str, work: Path, as_partial: bool, committed_end: int | None = None) -> None:
    consumer = kafka.consumer({"group.id": f"bench-{tag}", **RESTORE_CONSUMER_CONFIG})
    store = open_partition(work / tag, TOPIC, 0)
    if as_partial:
        store.write_restored((), 0)
    try:
        report = Restorer(kafka, consumer, Listeners(), BATCH).restore(store, COMMITTED, committed_end)
        assert report is not None and report.kind == ("partial" if as_partial else "full"), report
    finally:
        store.close()
        consumer.close()


if __name__ == "__main__":
    main()
