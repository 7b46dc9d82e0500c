"""Kafka Streams on bench_core.py's processing workload, under at_least_once and exactly_once_v2.

What it measures: the throughput (messages/s) of a Kafka Streams app doing what bench_core.py's
processing phase does with --output: --messages JSON orders {"customer": "c<k>", "amount": <int>}
keyed by customer over --keys keys in a source topic of --partitions partitions; a running total
per key is kept in a persistent (RocksDB) store with a changelog, and the totals are sent as
{"customer": ..., "total": ...} to an output topic of --partitions partitions (every update, or
the latest per key and commit with Kafka Streams' record cache: see Settings). It runs once
per --guarantees entry (processing.guarantee) and prints the overhead of exactly_once_v2 over
at_least_once, to set beside the engine's own exactly-once overhead (bench_core.py --output
--guarantee exactly-once / at-least-once).

How: the Java app is bench/kafka-streams (a Maven project: RunningTotals.java,
groupByKey().aggregate() into the store "totals", toStream().to(output)), built with Maven against
org.apache.kafka:kafka-streams at the broker's Kafka version from Maven Central (plus slf4j-nop to
silence logging). The orders are produced once (bench_core's produce_orders: the same messages, the
same producer settings); each run has its own application id (so it reads the source from the start
in a group of its own, with its own changelog) and its own output topic. The app's clock starts
right before KafkaStreams.start() (group join and partition assignment included, as in run_worker's
wall) and stops when the aggregator has been applied to all --messages records; messages/s =
messages / those seconds. JVM start-up is not included. The seconds until close() returned (final
flush of the caches and, under exactly_once_v2, the commit of the open transaction) are printed too,
with the messages/s they give, and the messages/s from the RUNNING state on (start-up excluded, like
bench_core's "inside the processing loop only" figure). Afterwards the output topic is read
(read_committed) and the last total of every key is checked against the expected one; a mismatch
fails the script. Before the measured runs, one unmeasured exactly_once_v2 run on 1,000 messages of
another topic makes a fresh broker create __consumer_offsets and __transaction_state, which would
otherwise slow whichever run came first.

Settings: commit.interval.ms = --commit-interval (5 s, as bench_core's commit_interval; Kafka
Streams' own default is 30 s under at_least_once and 100 ms under exactly_once_v2);
num.stream.threads = --threads (1: one worker, as bench_core); statestore.cache.max.bytes is Kafka
Streams' default (10 MiB) unless --cache-bytes is given. With the default cache the store, its
changelog and the output topic get the latest total of each key once per commit (or when the cache
fills) instead of every update, which is how Kafka Streams runs by default; --cache-bytes 0 writes
every update through, as bench_core's engine sends every running total. Everything else is Kafka
Streams' default (e.g. the producer's linger.ms, the consumer's max.poll.records).

A real single-node broker is started in a temporary directory with
dagster_stateful.local_kafka.broker.LocalKafkaBroker (and stopped at the end) unless
KAFKA_BOOTSTRAP_SERVERS is set, in which case that cluster is used. Needs Java 17+ and Maven (mvn),
which reaches Maven Central the first time.

As a library (bench/bench_compare.py): build_app() once, then run_totals() runs the app with no output
topic (with group_by="region": re-keyed by the value's "region" through a repartition topic first, for
bench_compare's "group_by" workload; with join_table and join_field="tier" as well, each order is first
joined with the KTable of that compacted topic, which adds the customer's "tier" to it, for its "join"
workload) and, once the expected records were aggregated, writes its whole
store (read through interactive queries) to a file (read_store_dump); run_restore() runs it again
for the same application id with its local state deleted, so the store is restored from the
changelog, processes the records appended since and reports the restore (a StateRestoreListener)
before dumping the store. Every result carries
the java process's peak RSS (its VmHWM, sampled: see PeakRss).

Run it from the repository root:

    .venv/bin/python bench/bench_kafka_streams.py                         # 1M messages, both guarantees
    .venv/bin/python bench/bench_kafka_streams.py --messages 100000
    .venv/bin/python bench/bench_kafka_streams.py --cache-bytes 0 --runs 2
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import orjson
from bench_core import PRODUCER_SETTINGS, amount, create_topic, engine_revision, load, print_machine, produce_orders
from bench_restore import bench_broker
from confluent_kafka import Consumer, KafkaError, TopicPartition

from dagster_stateful.local_kafka.broker import KAFKA_VERSION, find_java

JAVA_PROJECT = Path(__file__).resolve().parent / "kafka-streams"
JAVA_MAIN = "RunningTotals"
WARM_UP_MESSAGES = 1_000
GUARANTEES = ("at_least_once", "exactly_once_v2")
RESULT_LINE = re.compile(r"^RESULT (\S+) (\d+) ([\d.]+) ([\d.]+) (-?[\d.]+)$", re.MULTILINE)
DUMP_LINE = re.compile(r"^DUMP (\d+) ([\d.]+)$", re.MULTILINE)
RESTORE_LINE = re.compile(
    r"^RESTORE (\d+) (-?[\d.]+) (-?[\d.]+) ([\d.]+) (-?[\d.]+) (-?[\d.]+) (\d+) (\d+) (\d+)$", re.MULTILINE
)
NO_OUTPUT = "-"
"""The app's <output> argument for "no output topic": the totals only go to the store and its changelog."""
APP_TIMEOUT_S = 45 * 60


@dataclass(frozen=True)
class RunResult:
    guarantee: str
    messages: int
    seconds: float
    """From just before KafkaStreams.start() until the aggregator had seen every message."""
    seconds_closed: float
    """From just before KafkaStreams.start() until close() returned (less dump_seconds, in runs with a dump)."""
    seconds_running: float
    """From just before KafkaStreams.start() until the RUNNING state (-1 if never seen)."""
    wall: float
    """Of the whole java process, JVM start-up included."""
    peak_rss_mib: float | None = None
    """Peak resident set size of the java process (its VmHWM, see PeakRss), in MiB; None if not seen."""
    dumped_keys: int | None = None
    """Keys written to dump_path (runs with a store dump only)."""
    dump_seconds: float | None = None
    """Seconds the app spent, after `seconds`, waiting for the store to be up to date and reading it through
    interactive queries (runs with a store dump only; subtracted from seconds_closed, not from wall)."""
    dump_path: Path | None = None
    """The store dump ("<key>\\t<total>" lines; read it with read_store_dump), for runs with a dump."""

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    @property
    def rate_after_running(self) -> float | None:
        """Messages per second from the RUNNING state on (start-up excluded), if RUNNING was seen."""
        if self.seconds_running < 0 or self.seconds <= self.seconds_running:
            return None
        return self.messages / (self.seconds - self.seconds_running)

    @property
    def rate_closed(self) -> float:
        return self.messages / self.seconds_closed


def build_app(kafka_version: str = KAFKA_VERSION) -> str:
    """Build bench/kafka-streams with Maven (Kafka Streams at `kafka_version` from Maven Central, cached
    in ~/.m2 after the first build); returns the class path to run RunningTotals with. A build of the
    same sources for the same version whose class path is all still there is used as it is: Maven
    alone, finding nothing to do, takes 5-15 s (a JVM and its plugins)."""
    classpath_file = JAVA_PROJECT / "target" / "classpath.txt"
    stamp = JAVA_PROJECT / "target" / BUILD_STAMP
    inputs = build_inputs(kafka_version)
    if built_from(inputs, stamp, classpath_file):
        return class_path(classpath_file)
    mvn = shutil.which("mvn")
    if mvn is None:
        raise SystemExit("Maven (mvn) was not found on PATH; it builds bench/kafka-streams (apt-get install maven)")
    stamp.unlink(missing_ok=True)
    command = [
        mvn,
        "-B",
        "-q",
        "-f",
        str(JAVA_PROJECT / "pom.xml"),
        f"-Dkafka.version={kafka_version}",
        "package",
        "dependency:build-classpath",
        "-Dmdep.includeScope=runtime",
        f"-Dmdep.outputFile={classpath_file}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0 or not classpath_file.exists():
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-30:])
        raise SystemExit(f"FAILED: building {JAVA_PROJECT} with Maven (exit {result.returncode}):\n{tail}")
    written = stamp.with_name(f"{stamp.name}.{os.getpid()}")
    written.write_text(inputs)
    written.replace(stamp)
    return class_path(classpath_file)


BUILD_STAMP = "built-from.txt"
"""In bench/kafka-streams/target: what the last successful build was made from (`build_inputs`)."""


def build_inputs(kafka_version: str) -> str:
    """The Kafka version and a digest of the Maven project's files: what a build depends on."""
    digest = hashlib.sha256()
    for path in sorted([JAVA_PROJECT / "pom.xml", *(JAVA_PROJECT / "src").rglob("*")]):
        if path.is_file():
            digest.update(f"{path.relative_to(JAVA_PROJECT)}\0".encode() + path.read_bytes() + b"\0")
    return f"kafka {kafka_version}; sources {digest.hexdigest()}\n"


def built_from(inputs: str, stamp: Path, classpath_file: Path) -> bool:
    """Whether the last build was made from `inputs`, and its classes and every jar on its class path are there."""
    try:
        if stamp.read_text() != inputs:
            return False
        jars = [Path(entry) for entry in classpath_file.read_text().strip().split(os.pathsep) if entry]
    except OSError:
        return False
    main_class = JAVA_PROJECT / "target" / "classes" / "RunningTotals.class"
    return bool(jars) and main_class.is_file() and all(jar.is_file() for jar in jars)


def class_path(classpath_file: Path) -> str:
    return os.pathsep.join([str(JAVA_PROJECT / "target" / "classes"), classpath_file.read_text().strip()])


@dataclass(frozen=True)
class RestoreResult:
    """A run that restored the store from its changelog (empty local state) and then processed new records."""

    run: RunResult
    """The processing figures: messages = the new records; seconds = until all of them were aggregated
    (restore included); the dump of the store (restored state plus the new records) is run.dump_path."""
    records_restored: int
    """Changelog records restored (the sum of StateRestoreListener.onBatchRestored's counts)."""
    seconds_restoring: float
    """From the first onRestoreStart to the last onRestoreEnd (-1 if nothing was restored)."""
    seconds_restore_started: float
    """From just before KafkaStreams.start() until the first onRestoreStart (-1 if none)."""
    seconds_restore_ended: float
    """From just before KafkaStreams.start() until the last onRestoreEnd (-1 if none)."""
    seconds_first_record: float
    """From just before KafkaStreams.start() until the first new record was aggregated (processing resumed)."""
    seconds_all_records: float
    """From just before KafkaStreams.start() until all new records were aggregated (= run.seconds)."""
    restores_started: int
    """onRestoreStart calls (one per changelog partition restored, more if a restore was suspended)."""
    restores_ended: int
    """onRestoreEnd calls."""
    restores_suspended: int
    """onRestoreSuspended calls (a task moved to another thread while restoring)."""

    @property
    def restore_rate(self) -> float | None:
        """Records restored per second of seconds_restoring, if anything was restored."""
        if self.records_restored <= 0 or self.seconds_restoring <= 0:
            return None
        return self.records_restored / self.seconds_restoring

    @property
    def peak_rss_mib(self) -> float | None:
        return self.run.peak_rss_mib


@dataclass(frozen=True)
class JavaRun:
    """What a finished java process left: its output, wall seconds and peak RSS."""

    returncode: int
    stdout: str
    stderr: str
    wall: float
    peak_rss_mib: float | None


def run_java(command: list[str], timeout_s: float = APP_TIMEOUT_S) -> JavaRun:
    """Run `command` (stdout and stderr to temporary files) until it exits, killed after `timeout_s`
    seconds (then returncode is negative); its peak RSS is its VmHWM, read every 0.1 s (see
    `PeakRss`)."""
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        began = time.monotonic()
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr)
        peak = PeakRss(process.pid, command)
        timer = threading.Timer(timeout_s, process.kill)
        timer.start()
        try:
            peak.start()
            process.wait()
        except BaseException:
            process.kill()
            process.wait()
            raise
        finally:
            timer.cancel()
            peak.stop()
        wall = time.monotonic() - began
        stdout.seek(0)
        stderr.seek(0)
        return JavaRun(
            returncode=process.returncode,
            stdout=stdout.read().decode(errors="replace"),
            stderr=stderr.read().decode(errors="replace"),
            wall=wall,
            peak_rss_mib=peak.mib,
        )


class PeakRss(threading.Thread):
    """The peak RSS of a child process, from its /proc status (VmHWM) read every 0.1 s while it runs,
    plus the peaks of the processes it starts (this engine's restores in child processes): their
    sum, an upper bound of what the command held at once.

    Not `os.wait4`'s ru_maxrss: Linux carries the high-water mark of the memory a child had before
    `exec` over into it, and that memory was a copy of this (possibly large) process. VmHWM belongs
    to the memory the command itself uses; it is read only once /proc shows the command's own
    command line, i.e. after `exec`."""

    def __init__(self, pid: int, command: list[str]) -> None:
        super().__init__(daemon=True)
        self._pid = pid
        self._status = Path(f"/proc/{pid}/status")
        self._cmdline = Path(f"/proc/{pid}/cmdline")
        self._expected = "\0".join(command).encode()
        self._done = threading.Event()
        self._own = 0
        self._children: dict[int, int] = {}
        self.kib = 0

    @property
    def mib(self) -> float | None:
        return self.kib / 1024 if self.kib else None

    def run(self) -> None:
        while not self._done.wait(0.1):
            self._sample()

    def stop(self) -> None:
        self._done.set()
        if self.is_alive():
            self.join()

    def _sample(self) -> None:
        try:
            if not self._cmdline.read_bytes().startswith(self._expected):
                return
            self._own = max(self._own, _high_water_kib(self._status))
            children = Path(f"/proc/{self._pid}/task/{self._pid}/children").read_text().split()
        except (OSError, ValueError):
            return
        for child in map(int, children):
            try:
                peak = _high_water_kib(Path(f"/proc/{child}/status"))
            except (OSError, ValueError):
                continue  # ended meanwhile
            self._children[child] = max(self._children.get(child, 0), peak)
        self.kib = self._own + sum(self._children.values())


def _high_water_kib(status: Path) -> int:
    """A process's VmHWM from its /proc status, in KiB (0 before it has one)."""
    for line in status.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def app_command(
    class_path: str,
    bootstrap: str,
    source: str,
    output: str,
    application_id: str,
    guarantee: str,
    commit_interval_s: float,
    messages: int,
    state_dir: Path,
    threads: int,
    cache_bytes: int | None,
    java_heap: str,
    dump_path: Path | None = None,
    restore: bool = False,
    leave_group: bool = False,
    group_by: str | None = None,
    join_table: str | None = None,
    join_field: str | None = None,
    session_gap_ms: int = 0,
) -> list[str]:
    """The java command line running RunningTotals (see its header for the arguments and output lines);
    `group_by`: re-key by that string field of the JSON value first (its --group-by); `join_table` and
    `join_field`: join with the KTable of that topic first, adding the string field of its value to each
    record (its --join-table and --join-field); `session_gap_ms`: total per key and session of
    activity with that inactivity gap (its --session-gap)."""
    command = [
        find_java(),
        f"-Xmx{java_heap}",
        "-cp",
        class_path,
        JAVA_MAIN,
        bootstrap,
        source,
        output,
        application_id,
        guarantee,
        str(round(commit_interval_s * 1000)),
        str(messages),
        str(state_dir),
        str(threads),
    ]
    if cache_bytes is not None:
        command.append(str(cache_bytes))
    if dump_path is not None:
        command += ["--dump", str(dump_path)]
    if restore:
        command.append("--restore")
    if leave_group:
        command.append("--leave-group")
    if group_by is not None:
        command += ["--group-by", group_by]
    if session_gap_ms:
        command += ["--session-gap", str(session_gap_ms)]
    if join_table is not None:
        if join_field is None:
            raise ValueError("a join needs join_field, the table value's field added to each record")
        command += ["--join-table", join_table, "--join-field", join_field]
    return command


def finish_run(java: JavaRun, what: str, dump_path: Path | None = None) -> RunResult:
    """The RunResult of a finished app (its stderr printed, if any); SystemExit if it failed."""
    match = RESULT_LINE.search(java.stdout)
    dump = DUMP_LINE.search(java.stdout)
    if java.returncode != 0 or match is None or (dump_path is not None and dump is None):
        tail = "\n".join((java.stdout + java.stderr).strip().splitlines()[-30:])
        raise SystemExit(f"FAILED: the Kafka Streams app ({what}) exited {java.returncode}:\n{tail}")
    if java.stderr.strip():
        print(java.stderr.strip())
    return RunResult(
        guarantee=match.group(1),
        messages=int(match.group(2)),
        seconds=float(match.group(3)),
        seconds_closed=float(match.group(4)),
        seconds_running=float(match.group(5)),
        wall=java.wall,
        peak_rss_mib=java.peak_rss_mib,
        dumped_keys=int(dump.group(1)) if dump is not None and dump_path is not None else None,
        dump_seconds=float(dump.group(2)) if dump is not None and dump_path is not None else None,
        dump_path=dump_path,
    )


def run_app(
    class_path: str, bootstrap: str, source: str, output: str, guarantee: str, state_dir: Path, args: argparse.Namespace
) -> RunResult:
    command = app_command(
        class_path,
        bootstrap,
        source,
        output,
        f"{output}-app",
        guarantee,
        args.commit_interval,
        args.messages,
        state_dir,
        args.threads,
        args.cache_bytes,
        args.java_heap,
    )
    return finish_run(run_java(command), guarantee)


def default_dump_path(state_dir: Path, application_id: str) -> Path:
    """Where run_totals and run_restore put the store dump unless told: beside `state_dir`."""
    return state_dir.parent / f"{state_dir.name}-{application_id}-totals.tsv"


def run_totals(
    class_path: str,
    bootstrap: str,
    source: str,
    application_id: str,
    state_dir: Path,
    messages: int,
    commit_interval_s: float = 5.0,
    threads: int = 1,
    *,
    cache_bytes: int | None = None,
    dump_path: Path | None = None,
    guarantee: str = "at_least_once",
    java_heap: str = "1g",
    timeout_s: float = APP_TIMEOUT_S,
    group_by: str | None = None,
    join_table: str | None = None,
    join_field: str | None = None,
    session_gap_ms: int = 0,
) -> RunResult:
    """Run the Kafka Streams app once with no output topic: running totals of `source` into the store "totals"
    (and its changelog) under `application_id`, until `messages` records were aggregated; then the whole store
    is read through interactive queries and written to `dump_path` (default: default_dump_path), before close.
    With `group_by` (a string field of the JSON value, e.g. "region") the records are re-keyed by it first,
    through Kafka Streams' repartition topic "<application_id>-totals-repartition" (`groupBy` instead of
    `groupByKey`), and the totals are per value of that field; the seconds then cover both hops. With
    `join_table` (a compacted topic co-partitioned with `source`) each record is first joined (inner) with the
    KTable of that topic (store "customers"; topology.optimization=all, so the topic is its changelog too),
    which adds the string `join_field` of the table's JSON value to the record: group_by=join_field then sums
    per value of the table's field. With `session_gap_ms` the amounts are totalled per key and session of
    activity (SessionWindows with that gap, no grace; the session store "totals" kept 2 hours), and the
    dump holds every session.

    `state_dir` is state.dir (the app deletes its own state in it after close); commit_interval_s is
    commit.interval.ms in seconds, threads num.stream.threads, cache_bytes statestore.cache.max.bytes (None:
    Kafka Streams' 10 MiB). The app leaves the consumer group when it closes, so that a later run of the same
    application id (run_restore) is not held up by this one's members until their session times out (45 s).
    The result's seconds run from just before KafkaStreams.start(); read the totals with
    read_store_dump(result.dump_path). SystemExit if the app fails.
    """
    dump_path = dump_path or default_dump_path(state_dir, application_id)
    command = app_command(
        class_path,
        bootstrap,
        source,
        NO_OUTPUT,
        application_id,
        guarantee,
        commit_interval_s,
        messages,
        state_dir,
        threads,
        cache_bytes,
        java_heap,
        dump_path=dump_path,
        leave_group=True,
        group_by=group_by,
        join_table=join_table,
        join_field=join_field,
        session_gap_ms=session_gap_ms,
    )
    return finish_run(run_java(command, timeout_s), f"{guarantee}, {application_id}", dump_path)


def run_restore(
    class_path: str,
    bootstrap: str,
    source: str,
    application_id: str,
    state_dir: Path,
    new_messages: int,
    commit_interval_s: float = 5.0,
    threads: int = 1,
    *,
    cache_bytes: int | None = None,
    dump_path: Path | None = None,
    guarantee: str = "at_least_once",
    java_heap: str = "1g",
    clear_state: bool = True,
    timeout_s: float = APP_TIMEOUT_S,
) -> RestoreResult:
    """Run the app again for an `application_id` that has already processed `source` up to some offset (e.g.
    with run_totals), after `new_messages` more records were appended to `source`: with clear_state the whole
    `state_dir` is deleted first, so the store "totals" is restored from "<application_id>-totals-changelog".
    The app reports the restore (a StateRestoreListener), aggregates the `new_messages` records (no output
    topic) and then writes the store to `dump_path` as run_totals does: those totals include the restored state.
    Other arguments as for run_totals. SystemExit if the app fails.
    """
    if clear_state and state_dir.exists():
        shutil.rmtree(state_dir)
    dump_path = dump_path or default_dump_path(state_dir, application_id)
    command = app_command(
        class_path,
        bootstrap,
        source,
        NO_OUTPUT,
        application_id,
        guarantee,
        commit_interval_s,
        new_messages,
        state_dir,
        threads,
        cache_bytes,
        java_heap,
        dump_path=dump_path,
        restore=True,
        leave_group=True,
    )
    java = run_java(command, timeout_s)
    run = finish_run(java, f"restore, {guarantee}, {application_id}", dump_path)
    match = RESTORE_LINE.search(java.stdout)
    if match is None:
        tail = "\n".join(java.stdout.strip().splitlines()[-10:])
        raise SystemExit(f"FAILED: the Kafka Streams app ({application_id}) printed no RESTORE line:\n{tail}")
    return RestoreResult(
        run=run,
        records_restored=int(match.group(1)),
        seconds_restoring=float(match.group(2)),
        seconds_first_record=float(match.group(3)),
        seconds_all_records=float(match.group(4)),
        seconds_restore_started=float(match.group(5)),
        seconds_restore_ended=float(match.group(6)),
        restores_started=int(match.group(7)),
        restores_ended=int(match.group(8)),
        restores_suspended=int(match.group(9)),
    )


def read_store_dump(path: Path) -> dict[str, int]:
    """The totals in a store dump written by the app (--dump): key -> total (a session store's:
    "<key>@<start>-<end>" -> total)."""
    totals: dict[str, int] = {}
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            fields = line.rstrip("\n").split("\t")
            if len(fields) == 4:
                key, start, end, total = fields
                totals[f"{key}@{start}-{end}"] = int(total)
            else:
                totals[fields[0]] = int(fields[1])
    return totals


def warm_up(class_path: str, bootstrap: str, run_id: str, scratch_dir: Path, args: argparse.Namespace) -> None:
    """Run the app once, unmeasured, under exactly_once_v2 on a small topic of its own.

    A fresh broker creates __consumer_offsets and __transaction_state when they are first used; this
    keeps that (a few seconds) out of whichever measured run would come first.
    """
    began = time.monotonic()
    source = f"bench-ks-warm-up-{run_id}"
    create_topic(bootstrap, source, args.partitions)
    produce_orders(bootstrap, source, WARM_UP_MESSAGES, lambda i: f"c{i % args.keys}")
    output = f"{source}-out"
    create_topic(bootstrap, output, args.partitions)
    settings = argparse.Namespace(**{**vars(args), "messages": WARM_UP_MESSAGES})
    run_app(class_path, bootstrap, source, output, GUARANTEES[1], scratch_dir / "state" / output, settings)
    seconds = time.monotonic() - began
    print(f"warm-up: {WARM_UP_MESSAGES:,} messages under {GUARANTEES[1]}, not measured ({seconds:.1f} s)")


def last_totals(bootstrap: str, topic: str, partitions: int) -> tuple[dict[bytes, int], int]:
    """The last total per key in `topic` (read_committed, from the start to the end); and the record count."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-check-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    totals: dict[bytes, int] = {}
    records = 0
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        at_end: set[int] = set()
        deadline = time.monotonic() + 300
        while len(at_end) < partitions:
            if time.monotonic() > deadline:
                raise SystemExit(f"FAILED: reading {topic} did not reach the end of every partition in 300 s")
            for message in consumer.consume(10_000, timeout=1.0):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        at_end.add(message.partition() or 0)
                        continue
                    raise SystemExit(f"FAILED: reading {topic}: {error}")
                key, value = message.key(), message.value()
                if key is None or value is None:
                    raise SystemExit(f"FAILED: a record of {topic} has no key or value")
                totals[key] = orjson.loads(value)["total"]
                records += 1
    finally:
        consumer.close()
    return totals, records


def check_totals(bootstrap: str, output: str, args: argparse.Namespace) -> None:
    expected = [0] * args.keys
    for i in range(args.messages):
        expected[i % args.keys] += amount(i)
    totals, records = last_totals(bootstrap, output, args.partitions)
    wrong = [(k, expected[k], totals.get(f"c{k}".encode())) for k in range(args.keys)]
    wrong = [entry for entry in wrong if entry[1] != entry[2]]
    if wrong or len(totals) != args.keys:
        raise SystemExit(
            f"FAILED: output {output}: last totals wrong for {len(wrong)} of {args.keys} keys "
            f"({len(totals)} keys seen); first (key, expected, got): {wrong[:5]}"
        )
    print(f"check: the last total of all {args.keys:,} keys in {output} is right ({records:,} output records)")


def describe_rss(mib: float | None) -> str:
    return "n/a" if mib is None else f"{mib:,.0f} MiB"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages in the source topic")
    parser.add_argument("--keys", type=int, default=10_000, help="distinct keys")
    parser.add_argument("--partitions", type=int, default=6, help="partitions of the source and output topics")
    parser.add_argument("--commit-interval", type=float, default=5.0, help="commit.interval.ms, in seconds")
    parser.add_argument(
        "--guarantees", nargs="+", choices=GUARANTEES, default=list(GUARANTEES), help="processing.guarantee values"
    )
    parser.add_argument("--runs", type=int, default=1, help="runs of each guarantee (interleaved)")
    parser.add_argument("--threads", type=int, default=1, help="num.stream.threads")
    parser.add_argument(
        "--cache-bytes", type=int, default=None, help="statestore.cache.max.bytes (default: Kafka Streams' 10 MiB)"
    )
    parser.add_argument("--java-heap", default="1g", help="heap (-Xmx) of the Kafka Streams JVM")
    parser.add_argument("--broker-heap", default="1g", help="heap of the local broker (when one is started)")
    args = parser.parse_args()
    if min(args.messages, args.keys, args.partitions, args.runs, args.threads) <= 0 or args.commit_interval <= 0:
        parser.error("--messages, --keys, --partitions, --runs, --threads and --commit-interval must be positive")
    if args.cache_bytes is not None and args.cache_bytes < 0:
        parser.error("--cache-bytes must be >= 0")
    return args


def main() -> None:
    args = parse_args()
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    cache = "Kafka Streams' default (10 MiB)" if args.cache_bytes is None else f"{args.cache_bytes:,} bytes"
    print_machine()
    print("== settings")
    print(f"messages:            {args.messages:,}")
    print(f"keys:                {args.keys:,}")
    print(f"partitions:          {args.partitions} (source and output)")
    print(f"commit.interval.ms:  {round(args.commit_interval * 1000)}")
    print(f"guarantees:          {', '.join(args.guarantees)} ({args.runs} run(s) each)")
    print(f"num.stream.threads:  {args.threads}")
    print(f"statestore cache:    {cache}")
    print("store:               persistent RocksDB 'totals' (String -> Long) with its changelog; output JSON")
    print(f"kafka streams:       {KAFKA_VERSION}; JVM heap {args.java_heap}")
    print(f"input producer:      {PRODUCER_SETTINGS}")
    print(f"kafka:               {external or f'local broker started for this run (heap {args.broker_heap})'}")
    print(f"engine revision:     {engine_revision()}")

    began = time.monotonic()
    class_path = build_app()
    print(f"built {JAVA_PROJECT} with Maven ({time.monotonic() - began:.1f} s)")

    results: dict[str, list[RunResult]] = {guarantee: [] for guarantee in args.guarantees}
    with bench_broker("bench-kafka-streams-", args.broker_heap) as (bootstrap, scratch_dir):
        run_id = uuid.uuid4().hex[:8]
        source = f"bench-ks-orders-{run_id}"
        create_topic(bootstrap, source, args.partitions)
        customers = [f"c{k}" for k in range(args.keys)]
        seconds = produce_orders(bootstrap, source, args.messages, lambda i: customers[i % args.keys])
        print(
            f"produce: {args.messages:,} messages in {seconds:.1f} s "
            f"({args.messages / seconds:,.0f} msg/s; not measured)"
        )
        warm_up(class_path, bootstrap, run_id, scratch_dir, args)
        for run in range(args.runs):
            for guarantee in args.guarantees:
                print(f"\n== {guarantee}, run {run + 1}")
                output = f"bench-ks-{guarantee.replace('_', '-')}-{run}-{run_id}"
                create_topic(bootstrap, output, args.partitions)
                result = run_app(class_path, bootstrap, source, output, guarantee, scratch_dir / "state" / output, args)
                results[guarantee].append(result)
                print(
                    f"processed: {result.messages:,} messages in {result.seconds:.2f} s "
                    f"(RUNNING after {result.seconds_running:.2f} s; closed after {result.seconds_closed:.2f} s; "
                    f"java process {result.wall:.1f} s, peak RSS {describe_rss(result.peak_rss_mib)}; "
                    f"load avg {load()})"
                )
                print(
                    f"KAFKA STREAMS {guarantee}: {result.rate:,.0f} messages/s "
                    f"(until closed: {result.rate_closed:,.0f} messages/s)"
                )
                if result.rate_after_running is not None:
                    print(f"(from RUNNING on, start-up excluded: {result.rate_after_running:,.0f} messages/s)")
                check_totals(bootstrap, output, args)

    print("\n== summary (messages/s; mean over runs)")
    means = {g: statistics.mean(r.rate for r in runs) for g, runs in results.items()}
    means_closed = {g: statistics.mean(r.rate_closed for r in runs) for g, runs in results.items()}
    for guarantee in args.guarantees:
        rates = ", ".join(f"{r.rate:,.0f}" for r in results[guarantee])
        print(
            f"{guarantee:<16} {means[guarantee]:>10,.0f}  (until closed: {means_closed[guarantee]:,.0f}; runs: {rates})"
        )
    if set(GUARANTEES) <= set(args.guarantees):
        alo, eos = GUARANTEES
        overhead = 1 - means[eos] / means[alo]
        overhead_closed = 1 - means_closed[eos] / means_closed[alo]
        print(f"EXACTLY_ONCE_V2 OVERHEAD: {overhead:.1%} (until closed: {overhead_closed:.1%})")


if __name__ == "__main__":
    main()
