"""Spark compaction and Spark restore throughput per core on a real Spark standalone cluster, at 1 and 2 workers.

A changelog topic of --keys distinct keys (one record per key, in the engine's format, as
`bench_restore.py` produces it) over --partitions partitions is written to a Kafka broker (a local
one, or KAFKA_BOOTSTRAP_SERVERS's). Then, for each cluster size in --workers, a Spark standalone
cluster (`LocalSparkCluster`: a master and N workers of --cores-per-worker cores each, executors in
their own JVMs) is started, a SparkSession of this interpreter connects to it, and two things are
timed:

1. compaction: `build_snapshot` of the whole changelog from scratch (no previous snapshot) into a
   `file://` snapshot root; keys/s = keys in the snapshot / seconds;
2. restore: `restore_partitions` with method "spark" into an empty state directory, the real code
   path: executors write the SST files and, the snapshot root being a URI, upload them to the
   staging directory (no shared mount); this process downloads them, ingests them into each
   partition and checks the (empty) changelog tail. keys/s = keys restored / seconds end to end.

Per core is keys/s divided by the cluster's executor cores. The driver, the broker, each
executor's Python workers and (in the restore) the download and ingest run outside those cores,
on the same machine: each row also gives the share of the whole machine's CPU that was busy during
each phase (from /proc/stat). Each restored store
is checked: its key count equals the snapshot's, and its digest is the same at every cluster size.
The table is printed and written to bench/results/spark_scale.json.

    .venv/bin/python bench/bench_spark_scale.py                        # 2M keys, 4 partitions: about 4 minutes
    .venv/bin/python bench/bench_spark_scale.py --keys 200000          # a quick run
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench_restore import COMMITTED, bench_broker, print_machine, produce_changelog

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.monitoring.listeners import Listeners
from dagster_stateful.core.recovery.offline_restore import RestoreRequest, restore_partitions
from dagster_stateful.core.recovery.planner import RestoreMethod, RestorePath
from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest, SnapshotStore
from dagster_stateful.core.recovery.sst_staging import WrittenFiles
from dagster_stateful.core.recovery.verification import partition_digest
from dagster_stateful.core.state.directory import StateDirectory

APP, STORE, SOURCE = "bench-spark-scale", "state", "bench-spark-scale-source"
RESULTS = Path(__file__).parent / "results" / "spark_scale.json"

log = logging.getLogger("bench_spark_scale")


@dataclass
class Row:
    workers: int
    cores: int
    keys: int
    compaction_seconds: float
    compaction_keys_per_s: float
    compaction_keys_per_s_per_core: float
    compaction_finding_cut_seconds: float
    """Inside the compaction: the first Spark job (the committed end per partition, from the headers)."""
    compaction_machine_busy: float
    """Share of the machine's CPU time (all cores) busy during the compaction, whatever process used it."""
    restore_seconds: float
    restore_keys_per_s: float
    restore_keys_per_s_per_core: float
    restore_sst_writing_seconds: float
    """Inside the restore: the Spark job writing and uploading the SST files."""
    restore_fetch_ingest_seconds: float
    """Inside the restore: the rest (download, ingest, tail check), in this process."""
    restore_machine_busy: float
    session_start_seconds: float


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="cluster sizes, in order")
    parser.add_argument("--cores-per-worker", type=int, default=1)
    parser.add_argument("--worker-memory", default="3g", help="memory per worker (its executor gets 512 MiB less)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stdout)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    print_machine()
    load_at_start = " ".join(f"{load:.2f}" for load in os.getloadavg())
    print(f"load average at the start: {load_at_start}")
    settings = {
        "keys": arguments.keys,
        "partitions": arguments.partitions,
        "workers": arguments.workers,
        "cores_per_worker": arguments.cores_per_worker,
        "worker_memory": arguments.worker_memory,
        "executor_memory": executor_memory(arguments.worker_memory),
        "spark_sql_shuffle_partitions": arguments.partitions,
        "snapshot_root": "file:// URI (executors upload SST files, this process downloads them)",
    }
    print(
        f"settings: {arguments.keys:,} keys, {arguments.partitions} partitions, Spark standalone clusters of "
        f"{' then '.join(map(str, arguments.workers))} worker(s) x {arguments.cores_per_worker} core(s) "
        f"({arguments.worker_memory} per worker, executor {settings['executor_memory']}), file:// snapshot root; "
        f"on {os.cpu_count()} cores the driver, the broker and the workers share the machine"
    )
    with bench_broker("bench-spark-scale-") as (bootstrap, work):
        rows = run(arguments, bootstrap, work)
    print_table(rows)
    write_results(arguments.results, settings, rows, load_at_start)


def executor_memory(worker_memory: str) -> str:
    """The worker's memory less 512 MiB of headroom for the executor JVM's overhead (at least 512m)."""
    units = {"m": 1, "g": 1024}
    megabytes = int(worker_memory[:-1]) * units[worker_memory[-1].lower()]
    return f"{max(512, megabytes - 512)}m"


def run(arguments: argparse.Namespace, bootstrap: str, work: Path) -> list[Row]:
    config = AppConfig(name=APP, source=SOURCE, stores=(STORE,))
    kafka = KafkaClients({"bootstrap.servers": bootstrap})
    topic = config.changelog_topic(STORE)
    kafka.create_topic(SOURCE, arguments.partitions, 1, {})  # restore reads the group's (absent) commits on it
    kafka.create_topic(topic, arguments.partitions, 1, {"cleanup.policy": "compact"})
    log.info("producing the changelog: %s records ...", f"{arguments.keys:,}")
    started = time.monotonic()
    produce_changelog(bootstrap, topic, arguments.keys, arguments.partitions)
    ends = {p: high for p, (_, high) in kafka.watermarks(topic, range(arguments.partitions)).items()}
    print(f"changelog: {sum(ends.values()):,} records produced in {time.monotonic() - started:.1f} s (not measured)")
    # Spark's scratch space (driver, executors' block managers) inside the work directory, removed with it.
    os.environ["SPARK_LOCAL_DIRS"] = str(work / "spark-local")
    rows = []
    digests: dict[int, str] | None = None
    for workers in arguments.workers:
        row, found = measure(arguments, workers, config, kafka, bootstrap, ends, work / f"cluster-{workers}")
        if digests is not None:
            assert found == digests, f"the restore on {workers} worker(s) differs from the first cluster size's"
        digests = found
        rows.append(row)
    print("check: every restored partition holds the snapshot's keys, with the same digests at every cluster size")
    return rows


def measure(
    arguments: argparse.Namespace,
    workers: int,
    config: AppConfig,
    kafka: KafkaClients,
    bootstrap: str,
    ends: dict[int, int],
    work: Path,
) -> tuple[Row, dict[int, str]]:
    from dagster_stateful.spark.bulk_restore import write_sst_files
    from dagster_stateful.spark.cluster import LocalSparkCluster
    from dagster_stateful.spark.snapshots import build_snapshot

    cores = workers * arguments.cores_per_worker
    cluster = LocalSparkCluster(work / "spark", workers, arguments.cores_per_worker, arguments.worker_memory)
    log.info(
        "starting a Spark standalone cluster of %d worker(s) x %d core(s) ...", workers, arguments.cores_per_worker
    )
    try:
        master = cluster.start()
        with spark_session(master, arguments, cores) as (spark, session_seconds):
            snapshot_root = f"file://{work / 'snapshots'}"
            snapshots = SnapshotStore(snapshot_root, APP, STORE)
            log.info("[%d worker(s)] compaction: build_snapshot of the whole changelog ...", workers)
            started, cpu = time.monotonic(), cpu_times()
            committed = dict.fromkeys(ends, COMMITTED)  # the changelog holds no uncommitted record
            manifest = build_snapshot(
                spark, {"kafka.bootstrap.servers": bootstrap}, config.changelog_topic(STORE), ends, committed, snapshots
            )
            compaction_seconds, compaction_busy = time.monotonic() - started, busy_since(cpu)
            assert manifest.end_offsets == ends, "a snapshot of a fully committed changelog reaches its end"
            keys = sum(manifest.key_counts.values())
            assert keys == arguments.keys, f"the snapshot holds {keys:,} keys, not {arguments.keys:,}"
            log.info("[%d worker(s)] compaction: %s keys in %.1f s", workers, f"{keys:,}", compaction_seconds)

            writing: list[float] = []

            def sst_writer(
                store: SnapshotStore, snapshot: SnapshotManifest, partitions: list[int], staging: str
            ) -> WrittenFiles:
                began = time.monotonic()
                written = write_sst_files(spark, store, snapshot.snapshot_id, partitions, staging)
                writing.append(time.monotonic() - began)
                log.info("[%d worker(s)] restore: SST files written and uploaded in %.1f s", workers, writing[-1])
                return written

            state = StateDirectory(work / "state", config)
            request = RestoreRequest(
                partitions=tuple(sorted(ends)),
                snapshot_root=snapshot_root,
                method=RestoreMethod.SPARK,
                spark_cores=cores,
                sst_writer=sst_writer,
            )
            log.info("[%d worker(s)] restore: restore_partitions, method spark ...", workers)
            started, cpu = time.monotonic(), cpu_times()
            results = restore_partitions(config, kafka, state, Listeners(), request)
            restore_seconds, restore_busy = time.monotonic() - started, busy_since(cpu)
            assert {r.plan.path for r in results} == {RestorePath.SPARK}, [r.plan for r in results]
            restored = sum(report.records_applied for r in results for report in r.reports)
            assert restored == keys, f"the restore applied {restored:,} keys, not {keys:,}"
            log.info("[%d worker(s)] restore: %s keys in %.1f s", workers, f"{restored:,}", restore_seconds)
        digests = check_restored(state, manifest)
    finally:
        cluster.stop()
    row = Row(
        workers=workers,
        cores=cores,
        keys=keys,
        compaction_seconds=round(compaction_seconds, 2),
        compaction_keys_per_s=round(keys / compaction_seconds),
        compaction_keys_per_s_per_core=round(keys / compaction_seconds / cores),
        compaction_finding_cut_seconds=round(float(manifest.extra["seconds_finding_cut"]), 2),
        compaction_machine_busy=round(compaction_busy, 2),
        restore_seconds=round(restore_seconds, 2),
        restore_keys_per_s=round(keys / restore_seconds),
        restore_keys_per_s_per_core=round(keys / restore_seconds / cores),
        restore_sst_writing_seconds=round(sum(writing), 2),
        restore_fetch_ingest_seconds=round(restore_seconds - sum(writing), 2),
        restore_machine_busy=round(restore_busy, 2),
        session_start_seconds=round(session_seconds, 2),
    )
    return row, digests


@contextmanager
def spark_session(master: str, arguments: argparse.Namespace, cores: int) -> Iterator[tuple[Any, float]]:
    """A session of this interpreter on the cluster, holding all its cores, stopped on leaving."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from dagster_stateful.spark.connector import spark_jars_conf

    started = time.monotonic()
    spark = (
        SparkSession.builder.master(master)
        .appName(f"bench-spark-scale-{cores}")
        .config("spark.jars", spark_jars_conf())
        .config("spark.pyspark.python", sys.executable)
        .config("spark.executor.cores", str(arguments.cores_per_worker))
        .config("spark.executor.memory", executor_memory(arguments.worker_memory))
        .config("spark.cores.max", str(cores))
        .config("spark.driver.memory", "2g")  # taken when the first session launches the driver's JVM
        .config("spark.sql.shuffle.partitions", str(arguments.partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    try:
        spark.sparkContext.setLogLevel("ERROR")
        wait_for_executors(spark, cores // arguments.cores_per_worker)
        # Start every executor's Python worker before anything is timed.
        spark.sparkContext.parallelize(range(4 * cores), 4 * cores).map(lambda x: x).count()
        seconds = time.monotonic() - started
        log.info("Spark session on %s with %d executor core(s) ready in %.1f s", master, cores, seconds)
        yield spark, seconds
    finally:
        spark.stop()


def wait_for_executors(spark: Any, executors: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # getExecutorInfos counts the driver too.
        if len(spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()) - 1 >= executors:
            return
        time.sleep(0.2)
    raise RuntimeError(f"the Spark cluster did not give the session {executors} executors within {timeout:.0f} s")


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    fields = [int(field) for field in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    total = sum(fields)  # user nice system idle iowait irq softirq steal (guest time is inside user)
    return total - fields[3] - fields[4], total


def busy_since(start: tuple[int, int]) -> float:
    """The share of the machine's CPU time busy since `start` (1.0: every core busy all along)."""
    busy, total = cpu_times()
    return (busy - start[0]) / max(1, total - start[1])


def check_restored(state: StateDirectory, manifest: SnapshotManifest) -> dict[int, str]:
    """Each restored partition's digest, after checking it holds the snapshot's key count."""
    digests = {}
    for partition, expected in sorted(manifest.key_counts.items()):
        store = state.partition(STORE, partition)
        store.open()
        try:
            digest = partition_digest(store)
        finally:
            store.close()
        assert digest.keys == expected, f"partition {partition} holds {digest.keys:,} keys, the snapshot {expected:,}"
        digests[partition] = digest.sha256
    return digests


def print_table(rows: list[Row]) -> None:
    print()
    print(
        "| workers | executor cores | compaction keys/s | compaction keys/s/core | compaction s "
        "| restore keys/s | restore keys/s/core | restore s (SST writing + fetch/ingest) | machine CPU busy "
        "(compaction / restore) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row.workers} | {row.cores} | {row.compaction_keys_per_s:,} | {row.compaction_keys_per_s_per_core:,} "
            f"| {row.compaction_seconds:.1f} | {row.restore_keys_per_s:,} | {row.restore_keys_per_s_per_core:,} "
            f"| {row.restore_seconds:.1f} ({row.restore_sst_writing_seconds:.1f} "
            f"+ {row.restore_fetch_ingest_seconds:.1f}) | {row.compaction_machine_busy:.0%} / "
            f"{row.restore_machine_busy:.0%} |"
        )
    for row in rows:
        print(
            f"{row.workers} worker(s): the compaction's first job (the committed end, from every record's header) "
            f"took {row.compaction_finding_cut_seconds:.1f} of its {row.compaction_seconds:.1f} s; "
            f"session start {row.session_start_seconds:.1f} s (not measured)"
        )
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        print(
            f"{last.workers} workers against {first.workers}: compaction x"
            f"{last.compaction_keys_per_s / first.compaction_keys_per_s:.2f}, restore x"
            f"{last.restore_keys_per_s / first.restore_keys_per_s:.2f} "
            f"(linear would be x{last.cores / first.cores:.2f})"
        )


def write_results(path: Path, settings: dict[str, Any], rows: list[Row], load_at_start: str) -> None:
    import pyspark

    memory = next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal"))
    machine = {
        "cpus": os.cpu_count(),
        "ram_kb": int(memory.split()[1]),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "spark": pyspark.__version__,
        "load_at_start": load_at_start,
        "load_at_end": " ".join(f"{load:.2f}" for load in os.getloadavg()),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"machine": machine, "settings": settings, "rows": [asdict(row) for row in rows]}, indent=2) + "\n"
    )
    print(f"written: {path}")


if __name__ == "__main__":
    main()
