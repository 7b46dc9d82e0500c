"""Benchmark of the three restore paths for a large store, against a real Kafka broker and local Spark.

A changelog topic with --keys distinct keys (one record per key, in the engine's format: scoped
key, JSON value, processed-offset header) over --partitions partitions is produced, then the
Spark builds a snapshot of it (timed apart: it runs off the hot path, e.g. daily), then --tail
records update keys after the snapshot, and the store is rebuilt from scratch three ways, each
into an empty state directory:

1. changelog replay: the core's batched replay (`Restorer`), one partition after another;
2. local snapshot + tail: the partitions are loaded from the snapshot's SST image (a copy and an
   ingest per partition, `load_snapshot_partitions`), then the tail is replayed; the same again
   from the snapshot's Parquet rows, as a snapshot without an image loads (pyarrow + SST files
   written by --load-processes processes at once);
3. Spark bulk restore + tail: Spark tasks write the SST files from the snapshot
   (`write_sst_files`), the driver ingests them and replays the tail.

Printed per path: records (keys) per second and the seconds until processing could resume (the
store complete and at the changelog's end). Every path's result is checked by digest against
the replayed store. The machine and all settings are printed first.

    .venv/bin/python bench/bench_restore.py                 # 5M keys, 6 partitions
    .venv/bin/python bench/bench_restore.py --keys 500000   # a quick run
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Producer

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import RESTORE_CONSUMER_CONFIG, KafkaClients
from dagster_stateful.core.monitoring.listeners import Listeners
from dagster_stateful.core.recovery.changelog_format import source_offset_header
from dagster_stateful.core.recovery.parallel_load import load_snapshot_partitions
from dagster_stateful.core.recovery.restorer import Restorer
from dagster_stateful.core.recovery.snapshot_format import SnapshotStore
from dagster_stateful.core.recovery.snapshot_load import ingest_sst_files
from dagster_stateful.core.recovery.verification import partition_digest
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.keys import message_prefix
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.local_kafka.broker import BrokerSettings, LocalKafkaBroker

APP, STORE = "bench-restore", "state"
COMMITTED = 1 << 40  # every record's processed offset is below it: nothing is skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=5_000_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--tail", type=int, default=50_000, help="records written after the snapshot")
    parser.add_argument("--load-processes", type=int, default=0, help="snapshot load processes (0: one per core)")
    parser.add_argument("--spark-master", default="local[*]")
    arguments = parser.parse_args()
    print_machine()
    print(
        f"settings: {arguments.keys:,} keys, {arguments.partitions} partitions, {arguments.tail:,} tail records, "
        f"snapshot load processes {arguments.load_processes or os.cpu_count()}, spark {arguments.spark_master}, "
        f"restore batch 10,000 records, restore consumer {RESTORE_CONSUMER_CONFIG}"
    )
    with bench_broker("bench-restore-") as (bootstrap, work):
        run(arguments, bootstrap, work)


@contextmanager
def bench_broker(prefix: str, heap: str | None = None) -> Iterator[tuple[str, Path]]:
    """A scratch directory and a broker: KAFKA_BOOTSTRAP_SERVERS's, or a local one started there
    (with `heap`, else the default heap)."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    broker = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    try:
        if not bootstrap:
            broker = LocalKafkaBroker(work / "kafka", BrokerSettings(heap=heap) if heap else None)
            began = time.monotonic()
            bootstrap = broker.start(tie_to_parent=True)
            print(f"broker: {bootstrap} started in {time.monotonic() - began:.1f} s")
        yield bootstrap, work
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(work, ignore_errors=True)


def print_machine() -> None:
    memory = next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal"))
    print(
        f"machine: {os.cpu_count()} cores, {memory.split()[1]} kB RAM, {platform.platform()}, "
        f"Python {sys.version.split()[0]}"
    )


@dataclass(frozen=True)
class PathFigure:
    """One restore path's figures: keys (or records) restored, and seconds until processing could resume."""

    records: int
    seconds: float


def run(arguments: argparse.Namespace, bootstrap: str, work: Path, spark: Any = None) -> dict[str, PathFigure]:
    """Measure the three paths (see the module's docstring), in a Spark session of its own unless
    given one; returns each path's figures, by name: "replay", "local snapshot", "local snapshot
    (Parquet)", "spark"."""
    kafka = KafkaClients({"bootstrap.servers": bootstrap})
    app = f"{APP}-{uuid.uuid4().hex[:6]}"  # a changelog of its own for each run on one broker
    topic = changelog_of(app)
    kafka.create_topic(topic, arguments.partitions, 1, {"cleanup.policy": "compact"})
    started = time.monotonic()
    produce_changelog(bootstrap, topic, arguments.keys, arguments.partitions)
    print(f"changelog: {arguments.keys:,} records produced in {time.monotonic() - started:.1f} s (not measured)")
    snapshot_ends = {p: high for p, (_, high) in kafka.watermarks(topic, range(arguments.partitions)).items()}

    own_spark = spark is None
    if spark is None:
        spark = start_spark(arguments.spark_master)
    snapshots = SnapshotStore(str(work / f"snapshots-{app}"), app, STORE)
    from dagster_stateful.spark.snapshots import build_snapshot

    started = time.monotonic()
    committed = dict.fromkeys(snapshot_ends, COMMITTED)  # the benchmark's changelog holds no uncommitted record
    manifest = build_snapshot(spark, {"kafka.bootstrap.servers": bootstrap}, topic, snapshot_ends, committed, snapshots)
    assert manifest.end_offsets == snapshot_ends, "a snapshot of a fully committed changelog reaches its end"
    print(
        f"snapshot (Spark, off the hot path): {sum(manifest.key_counts.values()):,} keys in "
        f"{time.monotonic() - started:.1f} s (finding the committed end: {manifest.extra['seconds_finding_cut']:.1f} s)"
    )
    produce_changelog(bootstrap, topic, arguments.tail, arguments.partitions, update=1)
    print(f"tail: {arguments.tail:,} records written after the snapshot (updates of existing keys)")
    ends = {p: high for p, (_, high) in kafka.watermarks(topic, range(arguments.partitions)).items()}

    places = {name: work / f"{name}-{topic}" for name in ("replay", "local", "parquet", "spark")}
    replayed, replay = restore_by_replay(kafka, topic, places["replay"], arguments.partitions)
    local, snapshot = restore_from_snapshot(
        kafka, topic, places["local"], snapshots, manifest, ends, arguments.load_processes
    )
    without_image = dataclasses.replace(manifest, sst_image={})
    from_rows, parquet = restore_from_snapshot(
        kafka, topic, places["parquet"], snapshots, without_image, ends, arguments.load_processes
    )
    bulk, spark_bulk = restore_with_spark(spark, kafka, topic, places["spark"], snapshots, manifest, ends)
    for name, digests in (("local snapshot", local), ("local snapshot (Parquet)", from_rows), ("spark bulk", bulk)):
        assert digests == replayed, f"{name} restore differs from the changelog replay"
    print("check: every path gives the same digests as the changelog replay")
    for place in places.values():
        shutil.rmtree(place, ignore_errors=True)
    kafka.admin().delete_topics([topic])[topic].result(timeout=60)
    if own_spark:
        spark.stop()
    return {"replay": replay, "local snapshot": snapshot, "local snapshot (Parquet)": parquet, "spark": spark_bulk}


def produce_changelog(
    bootstrap: str,
    topic: str,
    keys: int,
    partitions: int,
    update: int = 0,
    compression: str = "lz4",
    shuffle_seed: int | None = None,
) -> None:
    """One record for each of the first `keys` keys; `update` > 0 writes new values for them, at
    processed offsets past the earlier rounds'. The engine writes its changelogs uncompressed
    (`compression="none"`); lz4 makes this bench's topics smaller. Keys go in ascending order, or
    shuffled with `shuffle_seed`, as a worker's changelog holds them (in the order its commits met them)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "compression.type": compression,
            "partitioner": "murmur2_random",
        }
    )
    order: Iterable[int] = range(keys)
    if shuffle_seed is not None:
        order = random.Random(shuffle_seed).sample(range(keys), keys)
    for n, i in enumerate(order):
        key = message_prefix(f"customer-{i:09d}".encode()) + b"total"
        while True:
            try:
                producer.produce(
                    topic,
                    key=key,
                    value=orjson.dumps({"total": (i + update) % 9973}),
                    partition=i % partitions,
                    headers=source_offset_header(update * (1 << 32) + n // partitions),
                )
                break
            except BufferError:
                producer.poll(0.05)
        if n % 20_000 == 0:
            producer.poll(0)
    producer.flush()


def changelog_of(app: str) -> str:
    return f"{app}-{STORE}-changelog"


def open_partition(state_dir: Path, topic: str, partition: int) -> StorePartition:
    """Partition `partition` of the store whose changelog is `topic` (`changelog_of` its app)."""
    config = AppConfig(name=topic.removesuffix(f"-{STORE}-changelog"), source="bench-source", stores=(STORE,))
    store = StateDirectory(state_dir, config).partition(STORE, partition)
    store.open()
    return store


def restore_by_replay(
    kafka: KafkaClients, topic: str, state_dir: Path, partitions: int
) -> tuple[dict[int, str], PathFigure]:
    consumer = kafka.consumer({"group.id": "bench-replay", **RESTORE_CONSUMER_CONFIG})
    restorer = Restorer(kafka, consumer, Listeners())
    started, records = time.monotonic(), 0
    for partition in range(partitions):
        store = open_partition(state_dir, topic, partition)
        report = restorer.restore(store, COMMITTED)
        records += report.records_applied if report else 0
        store.close()
    seconds = time.monotonic() - started
    consumer.close()
    print(
        f"1. changelog replay: {records:,} records in {seconds:.1f} s = {records / seconds:,.0f} records/s; "
        f"processing resumes after {seconds:.1f} s"
    )
    return digests_of(state_dir, topic, partitions), PathFigure(records, seconds)


def restore_from_snapshot(
    kafka, topic, state_dir, snapshots, manifest, ends, processes
) -> tuple[dict[int, str], PathFigure]:
    consumer = kafka.consumer({"group.id": "bench-snapshot", **RESTORE_CONSUMER_CONFIG})
    restorer = Restorer(kafka, consumer, Listeners())
    started = time.monotonic()
    stores = {partition: open_partition(state_dir, topic, partition) for partition in sorted(ends)}
    reports = load_snapshot_partitions(stores, snapshots, manifest, ends, processes or None)
    loaded_at = time.monotonic()
    keys = sum(report.records_applied for report in reports.values())
    tail = 0
    for store in stores.values():
        report = restorer.restore(store, COMMITTED)
        tail += report.records_applied if report else 0
        store.close()
    seconds = time.monotonic() - started
    consumer.close()
    source = "SST image" if manifest.sst_image else f"Parquet, {processes or os.cpu_count()} processes"
    print(
        f"2. local snapshot ({source}) + tail: {keys:,} keys and {tail:,} tail "
        f"records in {seconds:.1f} s = {keys / seconds:,.0f} keys/s (snapshot load {loaded_at - started:.1f} s, "
        f"tail replay {seconds - (loaded_at - started):.1f} s); processing resumes after {seconds:.1f} s"
    )
    return digests_of(state_dir, topic, len(ends)), PathFigure(keys, seconds)


def restore_with_spark(spark, kafka, topic, state_dir, snapshots, manifest, ends) -> tuple[dict[int, str], PathFigure]:
    from dagster_stateful.spark.bulk_restore import write_sst_files

    started = time.monotonic()
    output = tempfile.mkdtemp(prefix="sst-", dir=state_dir.parent)
    written = write_sst_files(spark, snapshots, manifest.snapshot_id, sorted(ends), output)
    written_at = time.monotonic()
    keys = 0
    consumer = kafka.consumer({"group.id": "bench-spark", **RESTORE_CONSUMER_CONFIG})
    restorer = Restorer(kafka, consumer, Listeners())
    for partition, (files, count) in written.items():
        store = open_partition(state_dir, topic, partition)
        ingest_sst_files(store, files, manifest.end_offsets[partition])
        restorer.restore(store, COMMITTED)  # the tail after the snapshot
        store.close()
        keys += count
    consumer.close()
    seconds = time.monotonic() - started
    shutil.rmtree(output, ignore_errors=True)
    print(
        f"3. Spark bulk restore ({spark.sparkContext.defaultParallelism} cores) + tail: {keys:,} keys in "
        f"{seconds:.1f} s = {keys / seconds:,.0f} keys/s (SST writing {written_at - started:.1f} s, ingest "
        f"and tail {seconds - (written_at - started):.1f} s); processing resumes after {seconds:.1f} s"
    )
    return digests_of(state_dir, topic, len(ends)), PathFigure(keys, seconds)


def digests_of(state_dir: Path, topic: str, partitions: int) -> dict[int, str]:
    digests = {}
    for partition in range(partitions):
        store = open_partition(state_dir, topic, partition)
        digests[partition] = partition_digest(store).sha256
        store.close()
    return digests


def start_spark(master: str):
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from dagster_stateful.spark.connector import spark_jars_conf

    started = time.monotonic()
    spark = (
        SparkSession.builder.master(master)
        .appName("bench-restore")
        .config("spark.jars", spark_jars_conf())
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "6")
        .config("spark.driver.memory", "4g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    print(f"spark session started in {time.monotonic() - started:.1f} s")
    return spark


if __name__ == "__main__":
    main()
