"""This engine, Quix Streams and Kafka Streams side by side on the same data, with the ceilings.

What it measures, on one broker (a local one it starts, or KAFKA_BOOTSTRAP_SERVERS's), each system
in a process of its own, one after another:

- "10k keys": a keyed running total (the JSON "amount" of each order added to a total per message
  key in a persistent state store with a changelog; no output topic) over --messages orders and
  --keys keys; messages/s.
- "1M keys": the same over --distinct-keys keys (1M orders over 1M keys: every message a new key).
- "restore": the store of the last "1M keys" run, its local state deleted, restored from its
  changelog when the system restarts; then it processes --restore-messages orders appended for the
  round. Records restored per second of restoring, and the seconds from the start until
  processing resumed.
- "group_by": re-keying. --messages orders keyed by customer (--customers of them), each carrying
  its customer's "region" (one of --regions, derived from the customer: c<k> lives in region
  r<k mod regions>), re-keyed by region and summed per region: this engine's
  `group_by("region").aggregate(Sum("amount"))` (`engine`: `group_by("region").update(...)`) and
  Kafka Streams' `groupBy((key, value) -> region).aggregate(...)`, each through its own repartition
  topic (as many partitions as the source). Messages/s of the whole pipeline, both hops, from the
  start (group join included) until every order was in its region's total: Kafka Streams' clock
  stops when its aggregator added the last order, this engine's when its worker saw both topics
  caught up (the source's offsets committed, the repartition topic processed to its end). Quix
  Streams is left out of this workload: its runner (bench/quix/quix_totals.py) has no group_by.
- "join": a stream-table join, then a sum per tier. A compacted table topic of --customers customers
  (as many partitions as the orders' topic, keyed by the orders' key strings c<k>, value
  {"tier": "t<n>"}, one of --tiers tiers: see Workload.tier), produced before the orders (its
  timestamps a minute earlier); then --messages orders over those customers, each (no tier in it)
  joined (inner) with its customer's row, re-keyed by the tier it got and summed per tier: this
  engine's `join(customers, how="inner", on_merge="keep-left").group_by("tier").aggregate(Sum("amount"))`
  (`engine`: `.update(...)`), Kafka Streams' `join(builder.table(<table topic>), joiner)` (a persistent
  store; topology.optimization=all, so the table's topic is its changelog too) then
  `groupBy((key, value) -> tier).aggregate(...)` through its repartition topic. This engine's table is
  --engine-join: "table" (the default, like for like), a partitioned table on the message key
  (`app.table`, kept beside the orders' partitions, as Kafka Streams' KTable), or "global", a global
  table looked up by the order's "customer" field (`app.global_table`; the same rows, every
  partition of the table read by the one worker). Messages/s as for "group_by", from
  the start (the table's read included, for both) until every order was in its tier's total; the
  totals per tier are checked against the ones recomputed from the orders and the table. Quix
  Streams is left out, as on "group_by".
- "sessions": a session-window sum. --messages orders over --keys keys, in bursts of
  `SESSION_BURST` orders of one key 1 ms apart (event times from an hour ago on), summed per key and
  session of --keys x `SESSION_BURST` / 2 ms of inactivity, so that every burst is one session and
  closes before its key's next one: this engine's `session_window(gap).aggregate(Sum("amount")).final()` (the
  `engine` system) and Kafka Streams' `windowedBy(SessionWindows.ofInactivityGapAndGrace(gap, 0))
  .aggregate(...)` with a merger, each keeping its sessions 2 hours, neither with an output topic.
  Messages/s from the start until every order was in its session; every session's total and end
  are checked against the ones recomputed from the orders. Quix Streams has no session windows.

Systems: `engine` (bench/engine_totals.py: a stateful `update` reading and writing the total, the
same computation as Quix's), `engine-aggregate` (the same script keeping the total with the
columnar `aggregate(Sum("amount"))`, folded a consumed batch at a time, the same computation as
Kafka Streams'; processing only: it restores as `engine` does), `quix` (Quix Streams in a venv of
its own, bench/quix/; not on "group_by"), `kafka-streams` (bench/kafka-streams, one stream thread)
and `kafka-streams-N` (as many stream threads as cores; processing only). Each is given the same
commit interval and partitions and its defaults otherwise (Kafka Streams: its 10 MiB record cache;
this engine: its 64 MiB one). Each figure is the median of --runs runs; every run's final state is
checked against the totals recomputed from the source (a faster wrong answer fails the run and the
script). The peak RSS of each system's process is reported too.

Ceilings: plain confluent-kafka loops on the same topics (bench/ceilings.py); on "group_by" and
"join" only consuming the orders (the first of their two hops).

Targets (bench/targets.py): the columnar aggregation at least 1.5x Kafka Streams' single thread
with 10k keys, 2x with 1M keys and 1.5x on "group_by" and on "join", the session windows 1.5x on
"sessions", the restore at least 1x, and peak RSS no higher than Kafka Streams', each printed as
met or missed. For a missed rate the engine runs once more under cProfile on that workload (its
totals checked too; --no-profile skips it) and the profile is printed.

Output: a table on stdout (the machine and settings first), then the targets, and `results.json` and
`results.png` (a bar chart) in --out. Run from the repository root:

    .venv/bin/python bench/bench_compare.py                      # everything, about 30 minutes
    .venv/bin/python bench/bench_compare.py --messages 200000 --distinct-keys 200000 --runs 1
    .venv/bin/python bench/bench_compare.py --workloads group_by --messages 500000
    .venv/bin/python bench/bench_compare.py --workloads join --messages 500000
    .venv/bin/python bench/bench_compare.py --workloads sessions --messages 500000

Only the topics of the workloads chosen are produced (and only their ceilings measured).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import orjson
from bench_core import PRODUCER_SETTINGS, amount, create_topic, engine_revision, load, produce_orders, total_ram
from bench_kafka_streams import build_app, read_store_dump, run_java, run_restore, run_totals
from bench_restore import bench_broker
from ceilings import Ceiling, consume_only, parse_and_total, with_changelog
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from quix_venv import quix_python
from targets import Verdict, print_verdicts, verdicts

BENCH = Path(__file__).resolve().parent
SYSTEMS = ("engine", "engine-aggregate", "quix", "kafka-streams", "kafka-streams-N")
ENGINES = ("engine", "engine-aggregate")
WORKLOADS = ("10k keys", "1M keys", "restore", "group_by", "join", "sessions")
RESTORING_SYSTEMS = ("engine", "quix", "kafka-streams")
REKEYING_SYSTEMS = ("engine", "engine-aggregate", "kafka-streams", "kafka-streams-N")
"""The systems of the "group_by" and "join" workloads: Quix's runner has no group_by."""
REKEYING_WORKLOADS = ("group_by", "join")
REKEY_FIELD = "region"
COMPACTED = {"cleanup.policy": "compact"}
JOIN_FIELD = "tier"
"""The field of the "join" workload's table rows that the orders are re-keyed and summed by."""
ENGINE_JOINS = ("global", "table")
SESSION_SYSTEMS = ("engine", "kafka-streams")
"""The systems of "sessions": this engine's session windows are one path (engine_totals.py
--session-gap), and Quix Streams has none."""
SESSION_BURST = 5
"""On "sessions", each key gets this many orders in a row (1 ms apart), then none while the other
keys get theirs (keys x burst ms); the inactivity gap is half that, so each burst is one session,
closed before the key's next one."""
"""This engine's table on "join" (engine_totals.py --join-kind): a global table or a partitioned one."""


@dataclass
class Run:
    """One run of one system on one workload."""

    rate: float
    """Messages/s (processing) or records restored per second of restoring (restore)."""
    seconds: float
    peak_rss_mib: float
    seconds_until_processing: float | None = None
    restored_records: int | None = None


@dataclass
class Figure:
    system: str
    workload: str
    runs: list[Run] = field(default_factory=list)
    last_group: str = ""
    """The consumer group (application id) of the last run: the restore workload restores its store."""

    @property
    def median(self) -> float:
        return statistics.median(run.rate for run in self.runs)

    @property
    def median_rss(self) -> float:
        return statistics.median(run.peak_rss_mib for run in self.runs)


@dataclass(frozen=True)
class Workload:
    """A source topic and what every key's total must be once it was processed."""

    topic: str
    messages: int
    keys: int
    regions: int = 0
    """Re-keyed ("group_by") when positive: each order carries its customer's region, one of this
    many, and the totals are per region."""
    tiers: int = 0
    """Joined ("join") when positive: a customer's tier, one of this many, is in `table` only; the
    orders are joined with it and the totals are per tier."""
    table: str = ""
    """The compacted table topic of "join": customer key -> {"tier": ...}, one row per customer."""
    session_gap: int = 0
    """Sessions ("sessions") when positive: the orders come in bursts of `SESSION_BURST` per key, 1 ms
    apart from `start_ms` on, and the totals are per key and session of this inactivity gap."""
    start_ms: int = 0

    @property
    def rekeyed(self) -> bool:
        return self.regions > 0 or self.tiers > 0

    @property
    def joined(self) -> bool:
        return self.tiers > 0

    @property
    def rekey_field(self) -> str | None:
        """The field the orders are re-keyed by (after the join, for "join"), if they are."""
        return JOIN_FIELD if self.joined else REKEY_FIELD if self.regions > 0 else None

    def key(self, i: int) -> str:
        if self.session_gap:
            return f"c{i // SESSION_BURST % self.keys}"
        return f"c{i % self.keys}"

    def timestamp(self, i: int) -> int:
        """Order i's event time on "sessions" (ms)."""
        return self.start_ms + i

    def region(self, i: int) -> str:
        """The region of order i's customer (customer c<k> lives in region r<k mod regions>)."""
        return f"r{i % self.keys % self.regions}"

    def tier(self, customer: int) -> str:
        """Customer c<customer>'s tier in the table: a hash of the number, so that a join that read
        another customer's row would, most of the time, put the order in another tier."""
        return f"t{(customer * 2654435761 % 2**32 >> 16) % self.tiers}"

    def order_tier(self, i: int) -> str:
        return self.tier(i % self.keys)

    def expected(self, appended: list[list[tuple[str, int]]]) -> dict[str, int]:
        """Each key's total (each region's or tier's, re-keyed); `appended`: the restores' (key, amount)
        rounds."""
        if self.session_gap:
            return self.expected_sessions()
        totals: dict[str, int] = {}
        group = self.order_tier if self.joined else self.region if self.regions > 0 else self.key
        for i in range(self.messages):
            key = group(i)
            totals[key] = totals.get(key, 0) + amount(i)
        for round_ in appended:
            for key, value in round_:
                totals[key] = totals.get(key, 0) + value
        return totals

    def expected_sessions(self) -> dict[str, int]:
        """Each session's total, as "<key>@<start>-<end>": a key's orders no two of which are more than
        the gap apart (recomputed plainly, in event-time order)."""
        open_sessions: dict[str, list[int]] = {}
        totals: dict[str, int] = {}
        for i in range(self.messages):
            key, timestamp = self.key(i), self.timestamp(i)
            session = open_sessions.get(key)
            if session is not None and timestamp - session[1] > self.session_gap:
                totals[f"{key}@{session[0]}-{session[1]}"] = session[2]
                session = None
            if session is None:
                open_sessions[key] = [timestamp, timestamp, amount(i)]
            else:
                session[1], session[2] = timestamp, session[2] + amount(i)
        totals.update({f"{key}@{start}-{end}": total for key, (start, end, total) in open_sessions.items()})
        return totals


# ----------------------------------------------------------------------------------------------
# Running a system


def run_measured(command: list[str], what: str) -> float:
    """Run `command` to its end; returns its peak RSS in MiB. Fails the script when it fails."""
    process = run_java(command)
    if process.returncode != 0:
        tail = "\n".join((process.stdout + process.stderr).strip().splitlines()[-30:])
        raise SystemExit(f"FAILED: {what} exited {process.returncode} after {process.wall:.0f} s:\n{tail}")
    return process.peak_rss_mib or 0.0


def check_totals(result: dict, expected: dict[str, int], what: str, complete: bool = True) -> None:
    totals: dict[str, int] = result["totals"]
    keys = expected if complete else totals
    wrong = [(key, expected.get(key), totals.get(key)) for key in keys if totals.get(key) != expected.get(key)]
    if wrong or (complete and len(totals) != len(expected)):
        extra = sorted(set(totals) - set(expected))
        raise SystemExit(
            f"FAILED: {what}: the totals of {len(wrong)} of {len(keys):,} keys are wrong ({len(totals):,} keys "
            f"held, {len(expected):,} expected); first (key, expected, got): {wrong[:5]}; first keys held, not "
            f"expected: {[(key, totals[key]) for key in extra[:5]]}"
        )


class Systems:
    """Runs each system's side of the benchmark as a subprocess and returns its result JSON."""

    def __init__(self, bootstrap: str, work: Path, args: argparse.Namespace) -> None:
        self.bootstrap = bootstrap
        self.work = work
        self.args = args
        self._quix_python: Path | None = None
        self._kafka_streams_class_path: str | None = None

    def prepare(self, systems: list[str]) -> None:
        """Build what the systems need before anything is measured (a venv, a Maven build)."""
        if "quix" in systems:
            began = time.monotonic()
            self._quix_python = quix_python()
            print(f"quix venv: {self._quix_python} ({time.monotonic() - began:.1f} s)")
        if any(system.startswith("kafka-streams") for system in systems):
            began = time.monotonic()
            self._kafka_streams_class_path = build_app()
            print(f"kafka streams app built with Maven ({time.monotonic() - began:.1f} s)")

    def run(
        self,
        system: str,
        workload: Workload,
        group: str,
        messages: int,
        restore: bool,
        engine_options: Sequence[str] = (),
    ) -> tuple[dict, float]:
        """(result JSON, peak RSS in MiB) of one run of `system` that processes `messages` of
        `workload.topic` as consumer group / application id `group` (`restore`: its local state was
        deleted, it restores it first; `engine_options`: more options of engine_totals.py)."""
        result_path = self.work / f"{group}.json"
        state_dir = self.work / "state" / group
        common = [
            "--bootstrap",
            self.bootstrap,
            "--source",
            workload.topic,
            "--group",
            group,
            "--state-dir",
            str(state_dir),
            "--messages",
            str(messages),
            "--commit-interval",
            str(self.args.commit_interval),
            "--result",
            str(result_path),
        ]
        if system in ENGINES:
            command = [
                sys.executable,
                str(BENCH / "engine_totals.py"),
                *common,
                "--partitions",
                str(self.args.partitions),
                *(["--aggregate"] if system == "engine-aggregate" else []),
                *(["--join-table", workload.table, "--join-kind", self.args.engine_join] if workload.joined else []),
                *(["--group-by", workload.rekey_field] if workload.rekey_field is not None else []),
                *(["--session-gap", str(workload.session_gap)] if workload.session_gap else []),
                *engine_options,
            ]
        elif system == "quix":
            assert self._quix_python is not None and not workload.rekeyed
            mode = ["--mode", "restore" if restore else "process"]
            command = [str(self._quix_python), str(BENCH / "quix" / "quix_totals.py"), *common, *mode]
        else:
            return self._run_kafka_streams(system, workload, group, messages, state_dir, restore)
        rss = run_measured(command, f"{system} on {workload.topic} ({group})")
        return orjson.loads(result_path.read_bytes()), rss

    def _run_kafka_streams(
        self, system: str, workload: Workload, group: str, messages: int, state_dir: Path, restore: bool
    ) -> tuple[dict, float]:
        """The Kafka Streams app's run, as the Python runners' result JSON."""
        assert self._kafka_streams_class_path is not None
        threads = (os.cpu_count() or 1) if system == "kafka-streams-N" else 1
        dump = self.work / f"{group}.dump"
        arguments = (self._kafka_streams_class_path, self.bootstrap, workload.topic, group, state_dir, messages)
        interval = self.args.commit_interval
        result: dict[str, Any] = {}
        if restore:
            restored = run_restore(*arguments, interval, threads, dump_path=dump, clear_state=False)
            run = restored.run
            result = {
                "restored_records": restored.records_restored,
                "restore_seconds": restored.seconds_restoring,
                "seconds_until_processing": restored.seconds_first_record,
            }
        else:
            run = run_totals(
                *arguments,
                interval,
                threads,
                dump_path=dump,
                group_by=workload.rekey_field,
                join_table=workload.table if workload.joined else None,
                join_field=JOIN_FIELD if workload.joined else None,
                session_gap_ms=workload.session_gap,
            )
        result |= {"messages": run.messages, "seconds": run.seconds, "totals": read_store_dump(dump)}
        return result, run.peak_rss_mib or 0.0

    def delete_state(self, group: str) -> None:
        shutil.rmtree(self.work / "state" / group)


# ----------------------------------------------------------------------------------------------
# The workloads


def processing(systems: Systems, names: list[str], workload: Workload, label: str, runs: int) -> list[Figure]:
    expected = workload.expected([])
    figures = {name: Figure(name, label) for name in names}
    for run in range(runs):
        for name in names:
            group = f"bench-{name}-{label.replace(' ', '')}-{run}-{uuid.uuid4().hex[:6]}"
            result, rss = systems.run(name, workload, group, workload.messages, restore=False)
            check_totals(result, expected, f"{name}, {label}, run {run + 1}")
            figure = Run(result["messages"] / result["seconds"], result["seconds"], rss)
            figures[name].runs.append(figure)
            figures[name].last_group = group
            rekeyed = f"; {result['rekeyed']:,} re-keyed" if result.get("rekeyed") else ""
            print(
                f"{label:<9} {name:<16} run {run + 1}: {figure.rate:>10,.0f} msg/s  {figure.seconds:6.1f} s  "
                f"peak RSS {rss:,.0f} MiB  (checked{rekeyed}; load {load()})"
            )
    return list(figures.values())


def restores(
    systems: Systems,
    bootstrap: str,
    groups: dict[str, str],
    workload: Workload,
    runs: int,
    appended_count: int,
    appended: list[list[tuple[str, int]]],
) -> list[Figure]:
    """`runs` rounds of restores of `groups`' stores; each round appends to `appended` what it appended."""
    figures = {name: Figure(name, "restore") for name in groups}
    for run in range(runs):
        appended.append(append_orders(bootstrap, workload, appended_count, run))
        expected = workload.expected(appended)
        for name, group in groups.items():
            systems.delete_state(group)
            result, rss = systems.run(name, workload, group, appended_count, restore=True)
            check_totals(result, expected, f"{name}, restore, run {run + 1}", complete=result.get("complete", True))
            restored, seconds = result["restored_records"], result["restore_seconds"]
            figure = Run(restored / seconds, seconds, rss, result["seconds_until_processing"], restored)
            figures[name].runs.append(figure)
            print(
                f"restore   {name:<16} run {run + 1}: {figure.rate:>10,.0f} records/s  {restored:,} records in "
                f"{seconds:.1f} s; processing after {figure.seconds_until_processing:.1f} s  "
                f"peak RSS {rss:,.0f} MiB  (checked; load {load()})"
            )
    return list(figures.values())


def append_orders(bootstrap: str, workload: Workload, count: int, round_: int) -> list[tuple[str, int]]:
    """Orders appended to `workload.topic` before a restore round: (key, amount) of each."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    orders = [(workload.key(i * 7919 + round_), 100 + i) for i in range(count)]
    for key, value in orders:
        producer.produce(workload.topic, key=key.encode(), value=orjson.dumps({"customer": key, "amount": value}))
    if producer.flush(30):
        raise SystemExit(f"FAILED: appending {count} orders to {workload.topic}")
    return orders


# ----------------------------------------------------------------------------------------------
# Ceilings, report


def ceilings(bootstrap: str, topics: dict[str, Workload], args: argparse.Namespace) -> list[dict]:
    """The plain loops on the topics produced (`topics`: by workload): consume only and with parsing and
    totals on the 10k-key topic, with parsing and totals and with a changelog on the 1M-key one, and
    consume only on the "group_by" and "join" ones (the orders: the first of their two hops)."""
    measured: list[tuple[str, Workload, Callable[[], Ceiling]]] = []
    few, many = topics.get("10k keys"), topics.get("1M keys")
    if few is not None:
        measured.append(("10k keys", few, partial(consume_only, bootstrap, few.topic, args.partitions)))
        measured.append(("10k keys", few, partial(parse_and_total, bootstrap, few.topic, args.partitions)))
    if many is not None:
        changelog = f"bench-ceiling-changelog-{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, changelog, args.partitions)
        measured.append(("1M keys", many, partial(parse_and_total, bootstrap, many.topic, args.partitions)))
        measured.append(
            (
                "1M keys",
                many,
                partial(with_changelog, bootstrap, many.topic, args.partitions, changelog, args.commit_interval),
            )
        )
    for label in REKEYING_WORKLOADS:
        rekeyed = topics.get(label)
        if rekeyed is not None:
            measured.append((label, rekeyed, partial(consume_only, bootstrap, rekeyed.topic, args.partitions)))
    rows = []
    for label, workload, measure in measured:
        ceiling = measure()
        if ceiling.totals:
            totals = {key.decode(): total for key, total in ceiling.totals.items()}
            check_totals({"totals": totals}, workload.expected([]), f"ceiling {ceiling.name}")
        rows.append({"workload": label, "name": ceiling.name, "rate": ceiling.rate, "messages": ceiling.messages})
        print(f"ceiling   {label:<9} {ceiling.name:<40} {ceiling.rate:>10,.0f} msg/s")
    return rows


def machine() -> dict[str, str]:
    return {
        "cpus": str(os.cpu_count()),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "ram": total_ram(),
        "load": load(),
        "engine revision": engine_revision(),
    }


def print_table(figures: list[Figure], ceiling_rows: list[dict]) -> None:
    by = {(figure.system, figure.workload): figure for figure in figures}
    systems = [name for name in SYSTEMS if any(figure.system == name for figure in figures)]
    print("\n== results (median of runs; restore in records/s, processing in messages/s; peak RSS in MiB)")
    header = f"{'workload':<10}" + "".join(f"  {name:>16}" for name in systems)
    pairs = [(engine, peer) for engine in systems if engine in ENGINES for peer in systems if peer not in ENGINES]
    header += "".join(f"  {engine + ' / ' + peer:>34}" for engine, peer in pairs)
    print(header)
    for workload in WORKLOADS:
        row = [by.get((name, workload)) for name in systems]
        if not any(row):
            continue
        cells = "".join(f"{f.median:>18,.0f}" if f else f"{'-':>18}" for f in row)
        ratios = "".join(f"  {ratio(by, engine, peer, workload):>34}" for engine, peer in pairs)
        print(f"{workload:<10}{cells}{ratios}")
        rss = "".join(f"{f.median_rss:>14,.0f} MiB" if f else f"{'-':>18}" for f in row)
        print(f"{'  peak RSS':<10}{rss}")
    restore = [f for f in figures if f.workload == "restore"]
    for figure in restore:
        until = statistics.median(run.seconds_until_processing or 0.0 for run in figure.runs)
        print(f"restore {figure.system}: processing resumed {until:.1f} s after the start (median)")
    for ceiling in ceiling_rows:
        print(f"ceiling   {ceiling['workload']:<9} {ceiling['name']:<40} {ceiling['rate']:>10,.0f} msg/s")


def ratio(by: dict[tuple[str, str], Figure], engine: str, peer: str, workload: str) -> str:
    ours, theirs = by.get((engine, workload)), by.get((peer, workload))
    return f"{ours.median / theirs.median:.2f}x" if ours and theirs else "-"


def write_outputs(
    out: Path, figures: list[Figure], ceiling_rows: list[dict], found: list[Verdict], args: argparse.Namespace
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    document = {
        "machine": machine(),
        "settings": {key: value for key, value in vars(args).items() if key != "out"},
        "figures": [
            {"system": f.system, "workload": f.workload, "median": f.median, "runs": [asdict(run) for run in f.runs]}
            for f in figures
        ],
        "ceilings": ceiling_rows,
        "targets": [{"target": v.what, "measured": v.measured, "met": v.met, "profile": v.profile} for v in found],
    }
    (out / "results.json").write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    plot(out / "results.png", figures, ceiling_rows)
    print(f"\nwrote {out / 'results.json'} and {out / 'results.png'}")


def plot(path: Path, figures: list[Figure], ceiling_rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = [w for w in WORKLOADS if any(f.workload == w for f in figures)]
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4.5), squeeze=False)
    for axis, workload in zip(axes[0], workloads, strict=True):
        shown = [f for f in figures if f.workload == workload]
        bars = axis.bar([f.system for f in shown], [f.median for f in shown], color="tab:blue")
        axis.bar_label(bars, labels=[f"{f.median / 1000:,.0f}k" for f in shown], fontsize=8)
        lines = [row for row in ceiling_rows if row["workload"] == workload]
        for row, style in zip(lines, ("--", ":", "-.", (0, (1, 4))), strict=False):
            axis.axhline(row["rate"], linestyle=style, linewidth=1, color="grey", label=f"ceiling: {row['name']}")
        axis.set_ylim(0, 1.35 * max([f.median for f in shown] + [row["rate"] for row in lines]))
        if lines:
            axis.legend(fontsize=7, loc="upper right")
        axis.set_title(workload)
        axis.set_ylabel("records restored / s" if workload == "restore" else "messages / s")
        axis.tick_params(axis="x", labelrotation=20)
    fig.suptitle(f"median of runs; {os.cpu_count()} cores, one local broker")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=1_000_000, help="orders of each processing workload")
    parser.add_argument("--keys", type=int, default=10_000, help="keys of the '10k keys' workload")
    parser.add_argument("--distinct-keys", type=int, default=1_000_000, help="keys of the '1M keys' workload")
    parser.add_argument("--restore-messages", type=int, default=60, help="orders appended before each restore")
    parser.add_argument(
        "--customers", type=int, default=100_000, help="customers (message keys) of 'group_by' and 'join' (table rows)"
    )
    parser.add_argument("--regions", type=int, default=1_000, help="regions (new keys) of 'group_by'")
    parser.add_argument("--tiers", type=int, default=8, help="tiers (new keys) of 'join', in the customers' table")
    parser.add_argument(
        "--engine-join",
        choices=ENGINE_JOINS,
        default="table",
        help="this engine's table on 'join': a partitioned table on the message key (App.table), or a global "
        "table on the order's customer field (App.global_table)",
    )
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--commit-interval", type=float, default=5.0, help="seconds, for every system")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (the median is reported)")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--no-ceilings", action="store_true", help="skip the plain confluent-kafka loops")
    parser.add_argument(
        "--no-profile", action="store_true", help="do not profile the engine on the workloads whose targets it missed"
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="where the JSON and PNG go")
    args = parser.parse_args()
    counts = (
        *(args.messages, args.keys, args.distinct_keys, args.restore_messages),
        *(args.customers, args.regions, args.tiers),
    )
    if min(*counts, args.partitions, args.runs) <= 0:
        parser.error("counts must be positive")
    if "restore" in args.workloads and "1M keys" not in args.workloads:
        parser.error("the restore workload restores the stores the '1M keys' runs built: select both")
    return args


def print_settings(args: argparse.Namespace) -> None:
    print("== machine")
    for name, value in machine().items():
        print(f"{name + ':':<18}{value}")
    print("== settings")
    print(f"workloads:        {', '.join(args.workloads)}; systems: {', '.join(args.systems)}")
    print(f"orders:           {args.messages:,} per processing workload, amounts 1..7, JSON")
    print(f"keys:             {args.keys:,} ('10k keys'), {args.distinct_keys:,} ('1M keys')")
    print(f"partitions:       {args.partitions}; commit interval {args.commit_interval} s; {args.runs} run(s) each")
    print(f"restore:          local state deleted, then {args.restore_messages} orders appended per round")
    if "group_by" in args.workloads:
        left_out = " (Quix Streams left out: its runner has no group_by)" if "quix" in args.systems else ""
        print(
            f"group_by:         {args.customers:,} customers (message keys) re-keyed by {REKEY_FIELD!r} "
            f"({args.regions:,} regions) through a repartition topic of {args.partitions} partitions{left_out}"
        )
    if "sessions" in args.workloads:
        print(
            f"sessions:         {args.keys:,} keys, orders in bursts of {SESSION_BURST} per key 1 ms apart, "
            f"summed per session of {args.keys * SESSION_BURST // 2:,} ms of inactivity (no grace; sessions kept "
            "2 hours); this "
            "engine: session_window(...).aggregate(Sum).final(), no output topic; Kafka Streams: "
            "windowedBy(SessionWindows).aggregate with a merger, no output topic (Quix Streams has no sessions)"
        )
    if "join" in args.workloads:
        left_out = " (Quix Streams left out)" if "quix" in args.systems else ""
        engine = {"global": "a global table (App.global_table)", "table": "a partitioned table (App.table)"}
        print(
            f"join:             a compacted table of {args.customers:,} customers ({args.tiers} tiers, "
            f"{args.partitions} partitions), produced first; orders joined (inner) with it, re-keyed by "
            f"{JOIN_FIELD!r} and summed; this engine: {engine[args.engine_join]}; Kafka Streams: a KTable, "
            f"topology.optimization=all{left_out}"
        )


def main() -> None:
    args = parse_args()
    print_settings(args)
    figures: list[Figure] = []
    ceiling_rows: list[dict] = []
    with bench_broker("bench-compare-") as (bootstrap, work):
        systems = Systems(bootstrap, work, args)
        only_rekeying = set(args.workloads) <= set(REKEYING_WORKLOADS)
        systems.prepare([name for name in args.systems if name in REKEYING_SYSTEMS or not only_rekeying])
        topics = prepare_topics(bootstrap, args)
        if not args.no_ceilings:
            ceiling_rows = ceilings(bootstrap, topics, args)
        if "10k keys" in topics:
            figures += processing(systems, args.systems, topics["10k keys"], "10k keys", args.runs)
        appended: list[list[tuple[str, int]]] = []
        groups: dict[str, str] = {}
        if "1M keys" in topics:
            many = topics["1M keys"]
            many_figures = processing(systems, args.systems, many, "1M keys", args.runs)
            figures += many_figures
            if "restore" in args.workloads:
                groups = {f.system: f.last_group for f in many_figures if f.system in RESTORING_SYSTEMS}
                figures += restores(systems, bootstrap, groups, many, args.runs, args.restore_messages, appended)
        rekeying = [name for name in args.systems if name in REKEYING_SYSTEMS]
        for label in REKEYING_WORKLOADS:
            if label in topics:
                figures += processing(systems, rekeying, topics[label], label, args.runs)
        if "sessions" in topics:
            sessioning = [name for name in args.systems if name in SESSION_SYSTEMS]
            figures += processing(systems, sessioning, topics["sessions"], "sessions", args.runs)
        found = verdicts(figures)
        if not args.no_profile:
            profile_missed(systems, found, topics, groups.get("engine"), appended)
    print_table(figures, ceiling_rows)
    print_verdicts(found)
    write_outputs(args.out, figures, ceiling_rows, found, args)


def profile_missed(
    systems: Systems,
    found: list[Verdict],
    workloads: dict[str, Workload],
    restored_group: str | None,
    appended: list[list[tuple[str, int]]],
) -> None:
    """Run the engine once more under cProfile for each missed throughput target (the restore: its
    local state deleted once more), check that run's totals, and keep its profile in the verdict.
    `workloads`: the topics produced, by workload."""
    for verdict in found:
        target = verdict.target
        if verdict.met or target is None:
            continue
        restore = target.workload == "restore"
        workload = workloads["1M keys" if restore else target.workload]
        rounds = appended if workload is workloads.get("1M keys") else []  # the restores appended to its topic
        if restore:
            if restored_group is None:
                continue
            group, messages = restored_group, 0
            systems.delete_state(group)
        else:
            group = f"bench-profile-{uuid.uuid4().hex[:6]}"
            messages = workload.messages + sum(map(len, rounds))
        print(f"profiling {target.system} on {target.workload} (missed: {verdict.measured})")
        result, _ = systems.run(target.system, workload, group, messages, restore, engine_options=["--profile"])
        check_totals(result, workload.expected(rounds), f"{target.system}, profiled")
        verdict.profile = result["profile"]


def prepare_topics(bootstrap: str, args: argparse.Namespace) -> dict[str, Workload]:
    """The source topics the chosen workloads need (the restore appends to the 1M-key one), by workload."""
    chosen: dict[str, Workload] = {}
    if "10k keys" in args.workloads:
        chosen["10k keys"] = Workload(f"bench-few-{uuid.uuid4().hex[:6]}", args.messages, args.keys)
    if "1M keys" in args.workloads:
        chosen["1M keys"] = Workload(f"bench-many-{uuid.uuid4().hex[:6]}", args.messages, args.distinct_keys)
    if "group_by" in args.workloads:
        topic = f"bench-regions-{uuid.uuid4().hex[:6]}"
        chosen["group_by"] = Workload(topic, args.messages, args.customers, args.regions)
    if "join" in args.workloads:
        run_id = uuid.uuid4().hex[:6]
        chosen["join"] = Workload(
            f"bench-join-orders-{run_id}",
            args.messages,
            args.customers,
            tiers=args.tiers,
            table=f"bench-join-customers-{run_id}",
        )
    if "sessions" in args.workloads:
        start_ms = int(time.time() * 1000) - 3_600_000  # an hour ago: past, and within the broker's retention
        topic = f"bench-sessions-{uuid.uuid4().hex[:6]}"
        gap = args.keys * SESSION_BURST // 2
        chosen["sessions"] = Workload(topic, args.messages, args.keys, session_gap=gap, start_ms=start_ms)
    for workload in chosen.values():
        if workload.joined:
            prepare_table(bootstrap, workload, args)
        prepare_topic(bootstrap, workload, args)
    return chosen


def prepare_table(bootstrap: str, workload: Workload, args: argparse.Namespace) -> None:
    """The "join" workload's compacted table topic (the orders' partition count): one row
    {"tier": ...} per customer, keyed by the orders' key strings with the orders' producer settings
    (so a customer's row and orders land in the same partition), its timestamps a minute before
    now (before every order's)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(workload.table, num_partitions=args.partitions, replication_factor=1, config=COMPACTED)
    admin.create_topics([topic])[workload.table].result(timeout=30)
    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_SETTINGS})
    errors: list[str] = []

    def on_delivery(error: Any, _message: Any) -> None:
        if error is not None:
            errors.append(str(error))

    began = time.monotonic()
    timestamp = int(time.time() * 1000) - 60_000
    for k in range(workload.keys):
        row = orjson.dumps({JOIN_FIELD: workload.tier(k)})
        while True:
            try:
                producer.produce(
                    workload.table,
                    key=workload.key(k).encode(),
                    value=row,
                    timestamp=timestamp,
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120) or errors:
        raise SystemExit(f"FAILED: producing the table {workload.table}: {errors[:5]}")
    print(
        f"produced {workload.keys:,} customers ({workload.tiers} tiers) to the compacted table {workload.table} "
        f"in {time.monotonic() - began:.1f} s"
    )


def prepare_topic(bootstrap: str, workload: Workload, args: argparse.Namespace) -> Workload:
    create_topic(bootstrap, workload.topic, args.partitions)
    keys = [workload.key(k) for k in range(workload.keys)]
    if workload.regions > 0:  # each customer lives in one region: the totals per region can be recomputed
        seconds = produce_orders(
            bootstrap,
            workload.topic,
            workload.messages,
            lambda i: keys[i % workload.keys],
            fields_of=lambda i: {REKEY_FIELD: workload.region(i)},
        )
        over = f"{workload.keys:,} customers in {workload.regions:,} regions"
    elif workload.session_gap:
        seconds = produce_orders(bootstrap, workload.topic, workload.messages, workload.key, workload.timestamp)
        over = f"{workload.keys:,} keys in bursts of {SESSION_BURST}, 1 ms apart"
    else:
        seconds = produce_orders(bootstrap, workload.topic, workload.messages, lambda i: keys[i % workload.keys])
        over = f"{workload.keys:,} keys"
    print(f"produced {workload.messages:,} orders over {over} to {workload.topic} in {seconds:.1f} s")
    return workload


if __name__ == "__main__":
    main()
