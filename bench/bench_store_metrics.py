"""What the per-store metrics cost: the engine's hot path with and without them, passes interleaved.

The workload is the worker's own processing path without Kafka: `BatchProcessor` runs pre-built
messages (--messages JSON orders in --partitions partitions, in consumed batches of 1000) through
the steps into `PartitionTransaction`s on real RocksDB store partitions (fresh ones each pass), and
the real `Committer` commits every --commit-every messages and at the end (changelogs off; the
consumer's and the producer's calls are stand-ins that return at once, so a commit is the engine's
part of it: collecting the changes and writing RocksDB).

Workloads: `update, 10k keys` (a stateful apply: `state.get` and `state.set` per message, mostly
answered by the record cache); `update, new keys` (every message a key never seen: every get reads
RocksDB); `aggregate, 10k keys` (`aggregate(Sum(...))`: one fold per message). And the state
operations alone (`state alone: get + set`, `state alone: fold`): per message, binding its key and
running the same steps on one partition's transaction, without decoding, batches or commits, where
what the metrics add per message is seen most sharply. On request only (`--workloads`), a whole
worker with Kafka in the loop (`worker with Kafka, update 10k keys` / `aggregate 10k keys`): a
bounded worker over --messages orders produced once to a local broker, changelogs on, a fresh
consumer group per pass.

"Metrics off" is the same engine with the metered files (`METERED_FILES`) as they were at
--baseline, the revision before store metrics (found from git: the parent of the commit that added
`core/monitoring/store_metrics.py`; HEAD while that file is not committed). Both variants are
copies of the current `dagster_stateful` taken at the start, so they differ in those files only.

Per workload and session (--sessions), each variant runs in a fresh process of its own, pinned to
one CPU (--cpu, the same for both) with the same hash seed, that builds the messages and makes a
warm-up pass; then the two make --rounds measured passes each, alternating (the order flips each
round), so that both see the same moments of the machine. Fresh processes per session matter: one
process can run the same code a few per cent faster or slower than another for the whole of its
life (measured: the same variant against itself in two processes, 4 to 9%), which no number of
passes in those two processes averages out; which of the two starts first alternates too (in
runs of the same code in both, the first one started was 1-3% faster). A pass's figure is messages
per second of the process's CPU time (wall-clock time would count the time other work took the
core away; it is shown too). The table gives each variant's median and the overhead: of the
medians, the median of the rounds' own overheads, and of the best passes (the least disturbed
ones). --control runs the "off" copy in both slots: what it shows is the measurement's own noise.

    .venv/bin/python bench/bench_store_metrics.py                      # about 17 minutes here
    .venv/bin/python bench/bench_store_metrics.py --control            # the same, "off" in both slots
    .venv/bin/python bench/bench_store_metrics.py --sessions 4 --workloads "state alone: fold"
    .venv/bin/python bench/bench_store_metrics.py --messages 200000 --sessions 6 --rounds 3 \
        --workloads "worker with Kafka, update 10k keys" "worker with Kafka, aggregate 10k keys"
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench_restore import bench_broker

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "dagster_stateful"
FEATURE_FILE = f"{PACKAGE}/core/monitoring/store_metrics.py"
METERED_FILES = {
    f"{PACKAGE}/core/state/kv.py": f"{PACKAGE}/core/state/kv.py",
    f"{PACKAGE}/core/state/live.py": f"{PACKAGE}/core/state/live.py",
    f"{PACKAGE}/core/state/view.py": f"{PACKAGE}/core/state/view.py",
    f"{PACKAGE}/core/state/partition.py": f"{PACKAGE}/core/state/partition.py",
    f"{PACKAGE}/core/state/transaction.py": f"{PACKAGE}/core/state/transaction.py",
    f"{PACKAGE}/core/state/rocksdb.py": f"{PACKAGE}/core/state/rocksdb.py",
    f"{PACKAGE}/core/processing/commit.py": f"{PACKAGE}/core/processing/commit/committer.py",
    f"{PACKAGE}/core/processing/worker.py": f"{PACKAGE}/core/processing/worker/loop.py",
    f"{PACKAGE}/core/monitoring/report.py": f"{PACKAGE}/core/monitoring/report.py",
}
"""The files that count, time and gather the store metrics, at the baseline -> where they are now (the new
modules are left in place, unused)."""
BASELINE_HELPERS = {
    f"{PACKAGE}/core/processing/progress.py": f"{PACKAGE}/core/processing/worker/baseline_progress.py",
}
"""Modules the metered files import at the baseline whose interface changed since: the "off" copy gets
them as they were, beside the current ones, under another name."""
RENAMED_MODULES = {
    "core.kafka.acls": "core.kafka.security.acls",
    "core.kafka.authorization": "core.kafka.security.authorization",
    "core.kafka.security_failures": "core.kafka.security.failures",
    "core.kafka.tls_probe": "core.kafka.security.tls_probe",
    "core.kafka.errors": "core.kafka.error_codes",
    "core.monitoring.store_metrics": "core.state.metrics",
    "core.monitoring.latency": "core.state.latency",
    "core.monitoring.describe": "core.queries.describe",
    "core.monitoring.key_location": "core.queries.key_location",
    "core.monitoring.key_reads": "core.queries.key_reads",
    "core.processing.commit_metadata": "core.state.commit_metadata",
    "core.recovery.state_table": "core.state_tables.table",
    "core.recovery.state_encoding": "core.state_tables.encoding",
    "core.recovery.state_writes": "core.state_tables.writes",
    "core.recovery.bootstrap": "core.state_tables.bootstrap",
    "core.recovery.migration": "core.state_tables.migration",
    "core.recovery.changelog": "core.recovery.changelog_replay",
    "core.recovery.restore": "core.recovery.offline_restore",
    "core.recovery.snapshots": "core.recovery.snapshot_format",
    "core.state.windows": "core.state.window_state",
    "core.processing.aggregations": "core.processing.dsl.aggregations",
    "core.processing.windows": "core.processing.dsl.windows",
    "core.processing.steps": "core.processing.dsl.steps",
    "core.processing.dataframe": "core.processing.dsl.dataframe",
    "core.processing.commit": "core.processing.commit.committer",
    "core.processing.source_commit": "core.processing.commit.source_commit",
    "core.processing.delivery": "core.processing.commit.delivery",
    "core.processing.transactions": "core.processing.commit.transactions",
    "core.processing.changelog_positions": "core.processing.commit.changelog_positions",
    "core.processing.restoring": "core.processing.restores.state_updater",
    "core.processing.background_restores": "core.processing.restores.background",
    "core.processing.bad_input": "core.processing.paths.bad_input",
    "core.processing.batch": "core.processing.paths.batch",
    "core.processing.batch_path": "core.processing.paths.batch_path",
    "core.processing.columns": "core.processing.paths.columns",
    "core.processing.vectorized": "core.processing.paths.vectorized",
    "core.processing.window_columns": "core.processing.paths.window_columns",
    "core.processing.emission": "core.processing.paths.emission",
    "core.processing.standbys": "core.processing.standbys.replicas",
    "core.processing.standby_placement": "core.processing.standbys.placement",
    "core.processing.worker": "core.processing.worker.loop",
    "core.processing.rebalance": "core.processing.worker.rebalance",
    "core.processing.progress": "core.processing.worker.baseline_progress",
    "core.processing.starting_offsets": "core.processing.worker.starting_offsets",
    "core.processing.client_settings": "core.processing.worker.client_settings",
}
"""Modules moved since the baseline (by the reshaping into one home per concept): old name -> new name."""
MOVED_IMPORTS = {
    f"from {PACKAGE}.core.recovery.changelog import Restorer": f"from {PACKAGE}.core.recovery.restorer import Restorer",
    f"from {PACKAGE}.core.recovery.changelog import source_offset_header": (
        f"from {PACKAGE}.core.recovery.changelog_format import source_offset_header"
    ),
    f"from {PACKAGE}.core.processing.commit_metadata import encode_stream_times": (
        f"from {PACKAGE}.core.processing.commit_metadata import encode_commit_metadata\n\n\n"
        "def encode_stream_times(times):\n    return encode_commit_metadata(times, 0, {})\n"
    ),
}
"""Imports of the metered files at the baseline whose names moved or changed since: rewritten to the
current ones (`encode_stream_times` is `encode_commit_metadata` without changelog ends)."""
BASELINE_APPENDS = {
    f"{PACKAGE}/core/state/transaction.py": """

_baseline_init = PartitionTransaction.__init__


def _init_with_what_came_since(self, *args, timer_store=None, exactly_once=False, **kwargs):
    _baseline_init(self, *args, **kwargs)
    self.timers = None
    self.observing = list(self.expiring)


PartitionTransaction.__init__ = _init_with_what_came_since
""",
}
"""Code appended to metered files of the "off" copy: what the current modules read of them that came
after the baseline, with the baseline's behaviour (a transaction has no timers: its observers of
message timestamps are its expiring stores)."""
WORKLOADS = {
    "update, 10k keys": (10_000, False),
    "update, new keys": (None, False),
    "aggregate, 10k keys": (10_000, True),
}
"""name -> (distinct keys, None: one per message; whether it aggregates)."""
KAFKA_WORKLOADS = {"worker with Kafka, update 10k keys": False, "worker with Kafka, aggregate 10k keys": True}
"""name -> whether it aggregates: a whole worker run against a local broker (changelogs on), what a
user's throughput is made of; the messages are produced once, each pass a fresh consumer group."""
KAFKA_KEYS = 10_000
STATE_LOOPS = {"state alone: get + set": False, "state alone: fold": True}
"""name -> whether it aggregates: the state operations alone, the finest view of what the metrics add."""
BATCH = 1000
LOOP_KEYS = 1000


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def default_baseline() -> str:
    """The parent of the commit that added the store metrics; HEAD when the history does not hold it
    (the metrics not committed yet, or a shallow clone): then both variants have them."""
    added = git("log", "--diff-filter=A", "--format=%H", "--", FEATURE_FILE).split()
    if not added:
        return "HEAD"
    parent = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{added[-1]}^"], cwd=ROOT, capture_output=True)
    return f"{added[-1]}^" if parent.returncode == 0 else "HEAD"


def make_variants(directory: Path, baseline: str) -> dict[str, Path]:
    """Two copies of the package, "on" as it is and "off" with the metered files at `baseline`."""
    variants = {"on": directory / "on", "off": directory / "off"}
    for root in variants.values():
        shutil.copytree(ROOT / PACKAGE, root / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    for path, current in {**METERED_FILES, **BASELINE_HELPERS}.items():
        target = variants["off"] / current
        try:
            target.write_text(with_moved_imports(git("show", f"{baseline}:{path}")) + BASELINE_APPENDS.get(path, ""))
        except subprocess.CalledProcessError:
            target.unlink()
    return variants


def with_moved_imports(source: str) -> str:
    for old, new in MOVED_IMPORTS.items():
        source = source.replace(old, new)
    modules = "|".join(re.escape(f"{PACKAGE}.{old}") for old in sorted(RENAMED_MODULES, key=len, reverse=True))
    return re.sub(
        rf"(?<![\w.])({modules})(?!\w)",
        lambda m: f"{PACKAGE}.{RENAMED_MODULES[m.group(1)[len(PACKAGE) + 1 :]]}",
        source,
    )


class Runner:
    """One variant's process, serving one workload: it builds the messages once, makes a warm-up
    pass, then makes one measured pass per `run()`."""

    def __init__(self, variant: str, root: Path, workload: str, args: argparse.Namespace) -> None:
        command = [sys.executable, __file__, "--serve", workload, "--messages", str(args.messages)]
        command += ["--partitions", str(args.partitions), "--commit-every", str(args.commit_every)]
        if workload in KAFKA_WORKLOADS:
            command += ["--bootstrap", args.bootstrap, "--source", args.source]
        self.variant = variant
        self.process = subprocess.Popen(
            command,
            env={**os.environ, "PYTHONPATH": str(root), "PYTHONHASHSEED": "0"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        os.sched_setaffinity(self.process.pid, {args.cpu})
        self._read()  # ready

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"the {self.variant!r} process stopped (exit code {self.process.wait()}); see its stderr")
        return dict(json.loads(line))

    def run(self) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write("run\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait()


# The child: one process, one variant, one workload.


def add_to_total(order: dict, state: Any) -> None:
    state.set("total", state.get("total", 0) + order["amount"])


def order_amount(order: dict) -> int:
    return int(order["amount"])


def make_batches(messages: int, keys: int | None, partitions: int) -> list[list[Any]]:
    """Consumed batches as a worker gets them: each message of a key in its partition, runs per partition."""
    from confluent_kafka import Message
    from orjson import dumps

    rng = random.Random(1)
    offsets = [0] * partitions
    batches = []
    for start in range(0, messages, BATCH):
        runs: list[list[Message]] = [[] for _ in range(partitions)]
        for i in range(start, min(messages, start + BATCH)):
            customer = i if keys is None else rng.randrange(keys)
            partition = customer % partitions
            value = dumps({"customer": customer, "amount": i % 100})
            key = f"c{customer}".encode()
            runs[partition].append(
                Message(topic="orders", partition=partition, offset=offsets[partition], key=key, value=value)
            )
            offsets[partition] += 1
        batches.append([message for run in runs for message in run])
    return batches


class ReturnAtOnce:
    """The consumer's commit and the producer's flush, as the engine calls them, doing nothing."""

    def commit(self, offsets: Any = None, asynchronous: bool = False) -> None:
        return None

    def flush(self, timeout: float | None = None) -> int:
        return 0


def bench_app(state_dir: Path, aggregate: bool, **settings: Any) -> Any:
    """The benchmark's app on `state_dir`: a running total per key, kept by an aggregation (`Sum`) or
    a stateful apply (a get and a set per message)."""
    from dagster_stateful.core import App, Sum

    app = App(source=settings.pop("source", "orders"), stores=["totals"], state_dir=state_dir, **settings)
    frame = app.dataframe()
    if aggregate:
        frame.aggregate(Sum(order_amount), name="total")
    else:
        frame.apply(add_to_total, stateful=True)
    return app


def process(batches: list[list[Any]], partitions: int, aggregate: bool, commit_every: int) -> dict[str, Any]:
    """One pass over `batches` on fresh stores: messages/s, and the store metrics where this engine has them."""
    from dagster_stateful.core.processing.commit.committer import Committer
    from dagster_stateful.core.processing.commit.delivery import DeliveryTracker
    from dagster_stateful.core.processing.paths.bad_input import BadInputHandler
    from dagster_stateful.core.processing.paths.batch import BatchProcessor
    from dagster_stateful.core.processing.restores.state_updater import Restorations
    from dagster_stateful.core.state.transaction import PartitionTransaction

    state_dir = Path(tempfile.mkdtemp(prefix="bench-store-metrics-"))
    try:
        app = bench_app(state_dir, aggregate, name="bench")
        frame = app.dataframe()
        config = app.config
        stores = {p: app.state.partition("totals", p) for p in range(partitions)}
        for store in stores.values():
            store.open()
        transactions = {
            p: PartitionTransaction(p, {"totals": stores[p]}, config.state_serde, None, frame.live_stores)
            for p in range(partitions)
        }
        stand_in: Any = ReturnAtOnce()
        committer = Committer(stand_in, stand_in, DeliveryTracker(), "orders", None)
        bad_input = BadInputHandler(config.on_error, committer.produce, config.dead_letter_topic)
        counts: dict[int, int] = {}
        processor = BatchProcessor(
            config, frame, transactions, Restorations(), bad_input, committer.produce, counts, refuse_damage
        )
        since_commit = 0
        started, cpu_started = time.perf_counter(), time.process_time()
        for batch in batches:
            index = 0
            while index < len(batch):
                index, done = processor.process(batch, index, commit_every - since_commit)
                since_commit += done
                if since_commit >= commit_every:
                    committer.commit(transactions.values())
                    since_commit = 0
        committer.commit(transactions.values())
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        for store in stores.values():
            store.close()
        processed = sum(counts.values())
        return {
            "rate": processed / seconds,
            "cpu_rate": processed / cpu_seconds,
            "metrics": described_metrics(committer),
        }
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def refuse_damage(partition: int, error: Exception) -> None:
    raise error


def described_metrics(committer: Any) -> dict[str, Any] | None:
    """The figures a person checks, from the run's store metrics (None: the engine has none)."""
    gathered = getattr(committer, "metrics", None)
    if gathered is None:
        return None
    by_store, _, commits = gathered.summary()
    store = by_store["totals"]
    figures = {
        f"{name}_count": store.operation(name).count for name in ("get", "put", "fold") if store.operation(name).count
    }
    figures |= {
        f"{name}_p99_us": round(store.operation(name).latency.p99_seconds * 1e6, 2)
        for name in ("get", "put", "fold")
        if store.operation(name).count
    }
    figures["cache_hit_ratio"] = round(store.cache_hit_ratio or 0.0, 4)
    figures["rocksdb_bytes_written"] = store.rocksdb.bytes_written if store.rocksdb else None
    figures["commit_p50_ms"] = round(commits.p50_seconds * 1e3, 2)
    figures["commit_p99_ms"] = round(commits.p99_seconds * 1e3, 2)
    return figures


def state_loop(aggregate: bool, messages: int) -> dict[str, Any]:
    """One pass of the state operations alone on a fresh store: per message, bind its key (one of
    `LOOP_KEYS`) as the worker does and run the step, with no decoding, batches or commits."""
    from dagster_stateful.core.state.keys import message_prefix
    from dagster_stateful.core.state.transaction import PartitionTransaction

    state_dir = Path(tempfile.mkdtemp(prefix="bench-store-metrics-"))
    try:
        app = bench_app(state_dir, aggregate, name="bench")
        frame = app.dataframe()
        store = app.state.partition("totals", 0)
        store.open()
        txn = PartitionTransaction(0, {"totals": store}, app.config.state_serde, None, frame.live_stores)
        run, views, begin, journals = frame.compiled(), txn.views, txn.begin_scoped, txn.journals
        prefixes = [message_prefix(f"c{i}".encode()) for i in range(LOOP_KEYS)]
        order = {"customer": 1, "amount": 3}
        started, cpu_started = time.perf_counter(), time.process_time()
        for offset in range(messages):
            begin(prefixes[offset % LOOP_KEYS], offset)
            run(order, views)
            for journal in journals:
                if journal:
                    journal.clear()
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        store.close()
        return {"rate": messages / seconds, "cpu_rate": messages / cpu_seconds, "metrics": None}
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def worker_run(bootstrap: str, source: str, aggregate: bool, commit_every: int) -> dict[str, Any]:
    """One bounded worker run over the whole of `source`, as a new app (its own group, changelog and
    store directory): messages per second of its process's CPU time and of wall-clock time."""

    state_dir = Path(tempfile.mkdtemp(prefix="bench-store-metrics-"))
    try:
        name = f"bench-metrics-{uuid.uuid4().hex[:12]}"
        app = bench_app(state_dir, aggregate, name=name, source=source, kafka=bootstrap, commit_every=commit_every)
        cpu_started = time.process_time()
        report = app.run_worker(max_seconds=600)
        cpu_seconds = time.process_time() - cpu_started
        processed = report.total_processed
        metrics = getattr(report, "store_metrics", None)
        return {
            "rate": processed / report.seconds,
            "cpu_rate": processed / cpu_seconds,
            "metrics": {f"{op}_count": metrics["totals"].operation(op).count for op in ("get", "put", "fold")}
            if metrics
            else None,
        }
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def produce_source(bootstrap: str, messages: int, partitions: int) -> str:
    """A topic of `messages` orders over `KAFKA_KEYS` customers, for the Kafka workloads."""
    from bench_core import create_topic, produce_orders

    source = f"bench-metrics-orders-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, source, partitions)
    produce_orders(bootstrap, source, messages, lambda i: f"c{(i * 7919) % KAFKA_KEYS}")
    return source


def serve(args: argparse.Namespace) -> None:
    """Build the workload's messages and make a warm-up pass, say so, then make one pass per "run" line read."""
    if args.serve in KAFKA_WORKLOADS:
        aggregate = KAFKA_WORKLOADS[args.serve]

        def one_pass() -> dict[str, Any]:
            return worker_run(args.bootstrap, args.source, aggregate, args.commit_every)
    elif args.serve in STATE_LOOPS:
        aggregate = STATE_LOOPS[args.serve]

        def one_pass() -> dict[str, Any]:
            return state_loop(aggregate, args.messages)
    else:
        keys, aggregate = WORKLOADS[args.serve]
        batches = make_batches(args.messages, keys, args.partitions)

        def one_pass() -> dict[str, Any]:
            return process(batches, args.partitions, aggregate, args.commit_every)

    one_pass()
    print(json.dumps({"ready": True}), flush=True)
    for _ in sys.stdin:
        print(json.dumps(one_pass()), flush=True)


# The parent: interleaved rounds and the table.


def print_settings(args: argparse.Namespace, baseline: str) -> None:
    revision = git("rev-parse", "--short", "HEAD").strip()
    dirty = bool(git("status", "--porcelain", "--", PACKAGE).strip())
    print("== machine and settings")
    print(f"cpu_count:    {os.cpu_count()}, python {sys.version.split()[0]}, {platform.platform()}")
    print(f"load avg:     {' '.join(f'{v:.2f}' for v in os.getloadavg())} (other work skews single runs)")
    print(f"engine:       {revision}{' + uncommitted changes' if dirty else ''}")
    baseline_commit = git("rev-parse", "--short", baseline).strip()
    print(f"metrics off:  {len(METERED_FILES)} metered files as at {baseline} ({baseline_commit})")
    print(f"workload:     {args.messages:,} messages in {args.partitions} partitions, batches of {BATCH}", end="")
    print(f", commit every {args.commit_every:,} messages and at the end")
    print(f"passes:       {args.sessions} sessions of a fresh process per variant (warmed up by one pass)", end="")
    print(f", each making {args.rounds} passes, alternating, the order flipped each round", end="")
    print(f"; both variants on CPU {args.cpu}, PYTHONHASHSEED=0")
    if args.control:
        print("control:      'on' runs the 'off' copy too: any overhead shown is the measurement's noise")


def overhead(off: float, on: float) -> float:
    return (off - on) / off * 100


def measure_workload(name: str, variants: dict[str, Path], args: argparse.Namespace) -> dict[str, list[dict]]:
    """`args.sessions` times: a fresh process per variant, then `args.rounds` passes of each,
    alternating (the order flips each round)."""
    print(f"\n== {name}: messages per CPU-second (per wall-clock second)")
    results: dict[str, list[dict]] = {"off": [], "on": []}
    for session in range(args.sessions):
        starting = ("off", "on") if session % 2 == 0 else ("on", "off")
        runners = {variant: Runner(variant, variants[variant], name, args) for variant in starting}
        try:
            for round_number in range(args.rounds):
                for variant in ("off", "on") if (session + round_number) % 2 == 0 else ("on", "off"):
                    results[variant].append(runners[variant].run())
                off, on = results["off"][-1], results["on"][-1]
                print(
                    f"session {session + 1:>2} round {round_number + 1:>2}  off {off['cpu_rate']:>9,.0f} "
                    f"({off['rate']:>9,.0f})  on {on['cpu_rate']:>9,.0f} ({on['rate']:>9,.0f})  "
                    f"{overhead(off['cpu_rate'], on['cpu_rate']):5.1f}%"
                )
        finally:
            for runner in runners.values():
                runner.close()
    return results


def print_table(results: dict[str, dict[str, list[dict]]]) -> None:
    print("\n| workload | metrics off, msg per CPU-s (median) | metrics on (median) | overhead of the medians ", end="")
    print("| median of the rounds' overheads | overhead of the best passes | wall-clock msg/s off / on (median) |")
    print("|---|---|---|---|---|---|---|")
    for name, runs in results.items():
        off, on = ([run["cpu_rate"] for run in runs[variant]] for variant in ("off", "on"))
        walls = [statistics.median(run["rate"] for run in runs[variant]) for variant in ("off", "on")]
        paired = statistics.median(overhead(a, b) for a, b in zip(off, on, strict=True))
        cpu_off, cpu_on = statistics.median(off), statistics.median(on)
        print(
            f"| {name} | {cpu_off:,.0f} | {cpu_on:,.0f} | {overhead(cpu_off, cpu_on):.1f}% | {paired:.1f}% | "
            f"{overhead(max(off), max(on)):.1f}% | {walls[0]:,.0f} / {walls[1]:,.0f} |"
        )


def measure(args: argparse.Namespace) -> None:
    baseline = args.baseline or default_baseline()
    print_settings(args, baseline)
    results: dict[str, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-store-metrics-") as directory, ExitStack() as stack:
        variants = make_variants(Path(directory), baseline)
        if args.control:
            variants["on"] = variants["off"]
        if any(name in KAFKA_WORKLOADS for name in args.workloads):
            args.bootstrap, _ = stack.enter_context(bench_broker("bench-store-metrics-"))
            args.source = produce_source(args.bootstrap, args.messages, args.partitions)
            print(f"kafka:        {args.messages:,} orders of {KAFKA_KEYS:,} customers in {args.source}")
        for name in args.workloads:
            results[name] = measure_workload(name, variants, args)
    shown = {name: runs["on"][-1]["metrics"] for name, runs in results.items() if runs["on"][-1]["metrics"]}
    if shown:
        print("\n== store metrics of the last 'on' pass")
    for name, figures in shown.items():
        print(f"{name}: {figures}")
    print_table(results)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--commit-every", type=int, default=50_000)
    parser.add_argument("--sessions", type=int, default=20, help="fresh processes per variant, one after the other")
    parser.add_argument("--rounds", type=int, default=5, help="measured passes of each variant per session")
    parser.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)), help="the CPU both variants run on")
    every = [*WORKLOADS, *STATE_LOOPS, *KAFKA_WORKLOADS]
    parser.add_argument(
        "--workloads", nargs="+", default=[*WORKLOADS, *STATE_LOOPS], choices=every, help="default: all but Kafka's"
    )
    parser.add_argument("--baseline", help="the git revision whose metered files are 'metrics off'")
    parser.add_argument("--control", action="store_true", help="'on' runs the 'off' copy too: the noise floor")
    parser.add_argument("--serve", choices=every, help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.serve:
        serve(args)
    else:
        measure(args)


if __name__ == "__main__":
    main()
