"""Benchmark of the stateful engine (dagster_stateful.core) against a real Kafka broker.

Measures two things:

1. Processing throughput: an App with one store ("totals") keeping a running total per key
   (a stateful `apply`, like tests/support/core_helpers.py's add_to_total) consumes a source topic of
   --messages JSON orders over --keys keys in --partitions partitions with
   `run_worker(until_caught_up=True)`. Printed: messages/s = report.total_processed / wall
   seconds of run_worker. The totals in the store are then checked against the expected ones
   (every key is checked, not only a sample); a mismatch fails the script loudly.
2. Changelog restore: a second app whose source has --restore-keys distinct keys is processed
   once (its changelog then holds one record per key), its local state is deleted
   (App.clear_state), and run_worker is run again with a RestoreListener. Printed: restored
   records/s (sum of RestoreReport.records_applied / sum of RestoreReport.seconds), and the wall
   seconds of that second run_worker, i.e. until processing could resume (it ends caught up right
   after the restore). The restored store is checked (key count and a sample of values).

Producing the input is timed and printed separately; it is not what is measured.

A real single-node broker is started in a temporary directory with
dagster_stateful.local_kafka.broker.LocalKafkaBroker (and stopped at the end) unless
KAFKA_BOOTSTRAP_SERVERS is set, in which case that cluster is used.

Run it from the repository root:

    .venv/bin/python bench/bench_core.py                       # 1M messages, 10k keys, 1M-key restore
    .venv/bin/python bench/bench_core.py --messages 200000 --restore-keys 0 --profile
    .venv/bin/python bench/bench_core.py --messages 500000 --restore-keys 0 --output --guarantee exactly-once

--profile runs each measured run_worker under cProfile and prints the top entries (by cumulative
time) of the engine's own functions; the throughput figures of a profiled run are not comparable.
--restore-keys 0 skips the restore phase.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import logging
import os
import platform
import pstats
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
from bench_restore import bench_broker
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from engine_totals import RestoreClock

from dagster_stateful.core import App, AppState, State, Sum, WorkerReport
from dagster_stateful.core.state.keys import split_store_key

STORE = "totals"
SAMPLE_SIZE = 1000
PRODUCER_SETTINGS = {
    "linger.ms": 50,
    "batch.size": 1_000_000,
    "batch.num.messages": 100_000,
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "compression.type": "lz4",
    "acks": "all",
    "enable.idempotence": True,  # retries keep each partition's order (event times stay in order)
}


def add_to_total(order: dict, state: State) -> dict:
    total = state.get("total", 0) + order["amount"]
    state.set("total", total)
    return {"customer": order["customer"], "total": total}


def order_amount(order: dict) -> int:
    return order["amount"]


def amount(i: int) -> int:
    return 1 + i % 7


class CountingRestoreListener(RestoreClock):
    """Counts batches and records as the engine reports them (a cross-check of the RestoreReports),
    and times the restores' span."""

    def __init__(self) -> None:
        super().__init__()
        self.partitions_started = 0
        self.batches = 0
        self.records = 0

    def on_restore_start(self, partition: int, store: str, start_offset: int, end_offset: int) -> None:
        super().on_restore_start(partition, store, start_offset, end_offset)
        self.partitions_started += 1

    def on_batch_restored(self, partition: int, store: str, batch_end_offset: int, num_restored: int) -> None:
        self.batches += 1
        self.records += num_restored


class StateClock:
    """A state listener noting when the worker last entered each state (monotonic seconds)."""

    def __init__(self) -> None:
        self.entered: dict[AppState, float] = {}

    def __call__(self, new: AppState, old: AppState) -> None:
        self.entered[new] = time.monotonic()


# ----------------------------------------------------------------------------------------------
# Machine, Kafka set-up and input


def total_ram() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def print_machine() -> None:
    print("== machine")
    print(f"cpu_count:   {os.cpu_count()}")
    print(f"platform:    {platform.platform()} ({platform.machine()})")
    print(f"processor:   {platform.processor() or 'unknown'}")
    print(f"python:      {sys.version.split()[0]} ({platform.python_implementation()})")
    print(f"total RAM:   {total_ram()}")
    print(f"load avg:    {load()} (1/5/15 min; other work on the machine skews the figures)")


def engine_revision() -> str:
    """The repository's commit, with "+ uncommitted changes" when the engine's files differ from it."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "dagster_stateful"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"{commit}{' + uncommitted changes' if dirty else ''}"


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(timeout=30)
    deadline = time.monotonic() + 30
    while name not in admin.list_topics(timeout=10).topics:
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {name} did not appear within 30 s")
        time.sleep(0.2)


def produce_orders(bootstrap: str, topic: str, count: int, key_of, timestamp_of=None, fields_of=None) -> float:
    """Produce `count` orders (message i: customer and key key_of(i), amount amount(i), timestamp
    timestamp_of(i) in ms, or the time of producing without one, and the fields fields_of(i) if
    given); returns seconds."""
    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_SETTINGS})
    errors: list[str] = []

    def on_delivery(error, _message) -> None:
        if error is not None:
            errors.append(str(error))

    dumps = orjson.dumps
    began = time.monotonic()
    for i in range(count):
        customer = key_of(i)
        order = {"customer": customer, "amount": amount(i), "order": i}
        value = dumps(order if fields_of is None else {**order, **fields_of(i)})
        while True:
            try:
                producer.produce(
                    topic,
                    key=customer.encode(),
                    value=value,
                    on_delivery=on_delivery,
                    timestamp=0 if timestamp_of is None else timestamp_of(i),
                )
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(120)
    seconds = time.monotonic() - began
    if remaining or errors:
        raise RuntimeError(f"producing to {topic}: {remaining} undelivered, errors: {errors[:5]}")
    return seconds


def make_app(bootstrap: str, name: str, source: str, state_dir: Path, args: argparse.Namespace) -> App:
    app = App(
        name=name,
        source=source,
        stores=[STORE],
        state_dir=state_dir,
        kafka=bootstrap,
        commit_interval=args.commit_interval,
        commit_every=args.commit_every,
        restore_batch_size=args.restore_batch_size,
        restore_processes=getattr(args, "restore_processes", None),
        processing_guarantee=args.guarantee,
    )
    frame = app.dataframe()
    if args.aggregate:
        frame.aggregate(Sum("amount"), name="total")
    elif args.aggregate_per_message:
        frame.aggregate(Sum(order_amount), name="total", emit="per-message")
    else:
        frame.apply(add_to_total, stateful=True)
    if args.output:
        output = f"{name}-out"
        create_topic(bootstrap, output, args.partitions)
        app.to_topic(frame, output)
    return app


def read_store(app: App, partitions: int) -> dict[bytes, bytes]:
    """{message key: raw value of state key "total"} across every local partition of the store."""
    content: dict[bytes, bytes] = {}
    for partition in range(partitions):
        part = app.state.partition(STORE, partition)
        part.open()
        try:
            for key, value in part.items():
                message_key, state_key = split_store_key(key)
                if state_key == b"total":
                    content[message_key] = value
        finally:
            part.close()
    return content


# ----------------------------------------------------------------------------------------------
# Measured runs


def run_measured(app: App, profile: bool, label: str) -> tuple[WorkerReport, float, dict[str, float]]:
    """run_worker(until_caught_up=True); returns the report, its wall seconds and, in seconds from
    the start of the call: "running" (partitions assigned and restored: processing can start) and
    "loop_done" (the loop saw it was caught up; final commit, lag query and close follow)."""
    profiler = cProfile.Profile() if profile else None
    clock = StateClock()
    app.add_state_listener(clock)
    reset_peak_rss()
    began = time.monotonic()
    if profiler is not None:
        profiler.enable()
    try:
        report = app.run_worker(until_caught_up=True)
    finally:
        if profiler is not None:
            profiler.disable()
        app.listeners.state.remove(clock)
    wall = time.monotonic() - began
    marks = {
        name: clock.entered[state] - began
        for name, state in (("running", AppState.RUNNING), ("loop_done", AppState.PENDING_SHUTDOWN))
        if state in clock.entered
    }
    print(f"({label}: load avg at the end {load()})")
    print(
        f"memory: peak RSS of this process during the run {peak_rss_mib()}; record caches at most "
        f"{report.cache_bytes_peak / 2**20:.1f} MiB (cache_max_bytes {app.config.cache_max_bytes / 2**20:.0f} MiB, "
        f"{report.cache_commits} early commit(s))"
    )
    if profiler is not None:
        print_profile(profiler, label)
    return report, wall, marks


def reset_peak_rss() -> None:
    """Start the kernel's peak-RSS count (VmHWM) afresh, so it covers the measured run only (Linux)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_rss_mib() -> str:
    """VmHWM of this process (since `reset_peak_rss`), or "n/a" where /proc does not say."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return "n/a"
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return f"{int(line.split()[1]) / 1024:,.0f} MiB"
    return "n/a"


def describe_marks(marks: dict[str, float], wall: float) -> str:
    running, done = marks.get("running"), marks.get("loop_done")
    if running is None or done is None:
        return ""
    return (
        f"  [start-up until partitions assigned {running:.2f} s | processing loop {done - running:.2f} s | "
        f"final commit + lag query + close {wall - done:.2f} s]"
    )


def print_profile(profiler: cProfile.Profile, label: str, top: int = 15) -> None:
    print(profile_text(profiler, label, top))


def profile_text(profiler: cProfile.Profile, label: str, top: int = 15) -> str:
    """The engine's functions by cumulative time, then any module's by own time, `top` of each."""
    sections = []
    for order, only, title in (
        ("cumulative", r"dagster_stateful", "engine functions by cumulative time"),
        ("tottime", r"", "functions (any module) by own time"),
    ):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(only, top)
        lines = out.getvalue().splitlines()
        start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), 0)
        sections.append(f"-- cProfile of {label}: top {top} {title}\n" + "\n".join(lines[start:]).rstrip())
    return "\n".join(sections)


def check_report(report: WorkerReport, expected_messages: int, what: str) -> None:
    if report.total_processed != expected_messages or report.total_lag != 0:
        raise SystemExit(
            f"FAILED ({what}): processed {report.total_processed} of {expected_messages} messages, "
            f"lag left {report.total_lag}, stop reason {report.stop_reason!r}"
        )


def processing_phase(bootstrap: str, state_dir: Path, run_id: str, args: argparse.Namespace) -> None:
    print("\n== processing throughput")
    source = f"bench-orders-{run_id}"
    create_topic(bootstrap, source, args.partitions)
    keys = [f"c{k}".encode() for k in range(args.keys)]
    customers = [key.decode() for key in keys]
    seconds = produce_orders(bootstrap, source, args.messages, lambda i: customers[i % args.keys])
    print(
        f"produce: {args.messages:,} messages in {seconds:.1f} s ({args.messages / seconds:,.0f} msg/s; not measured)"
    )

    app = make_app(bootstrap, f"bench-totals-{run_id}", source, state_dir, args)
    report, wall, marks = run_measured(
        app, args.profile, f"processing {args.messages:,} messages over {args.keys:,} keys"
    )
    check_report(report, args.messages, "processing")
    print(
        f"processed: {report.total_processed:,} messages in {wall:.2f} s wall "
        f"(worker's own {report.seconds:.2f} s; {report.rebalances} rebalance(s); stop: {report.stop_reason})"
    )
    print(describe_marks(marks, wall))
    print(f"PROCESSING THROUGHPUT: {report.total_processed / wall:,.0f} messages/s")
    if "running" in marks and "loop_done" in marks:
        loop = marks["loop_done"] - marks["running"]
        print(
            f"(inside the processing loop only, start-up and shut-down excluded: "
            f"{report.total_processed / loop:,.0f} messages/s)"
        )

    # Correctness: every key's total (the check is cheap, so no need to sample).
    expected = [0] * args.keys
    for i in range(args.messages):
        expected[i % args.keys] += amount(i)
    stored = read_store(app, args.partitions)
    wrong = [
        (keys[k], expected[k], stored.get(keys[k]))
        for k in range(args.keys)
        if stored.get(keys[k]) is None or orjson.loads(stored[keys[k]]) != expected[k]
    ]
    if wrong or len(stored) != args.keys:
        raise SystemExit(
            f"FAILED: totals wrong for {len(wrong)} of {args.keys} keys (store holds {len(stored)} "
            f"keys); first: {[(k.decode(), e, g) for k, e, g in wrong[:5]]}"
        )
    print(f"check: totals of all {args.keys:,} keys are right")


def restore_phase(bootstrap: str, state_dir: Path, run_id: str, args: argparse.Namespace) -> None:
    print("\n== changelog restore")
    count = args.restore_keys
    source = f"bench-restore-src-{run_id}"
    create_topic(bootstrap, source, args.partitions)
    seconds = produce_orders(bootstrap, source, count, lambda i: f"k{i:08d}")
    print(f"produce: {count:,} messages with distinct keys in {seconds:.1f} s (not measured)")

    app = make_app(bootstrap, f"bench-restore-{run_id}", source, state_dir, args)
    began = time.monotonic()
    first = app.run_worker(until_caught_up=True)
    wall = time.monotonic() - began
    check_report(first, count, "filling the store")
    print(
        f"fill: {first.total_processed:,} messages ({count:,} distinct keys) processed in {wall:.2f} s "
        f"({first.total_processed / wall:,.0f} messages/s; every message a new key)"
    )
    watermarks = app.kafka.watermarks(app.changelog_topic(STORE), range(args.partitions))
    changelog_records = sum(high - low for low, high in watermarks.values())
    print(f"changelog {app.changelog_topic(STORE)}: {changelog_records:,} records over {args.partitions} partitions")
    if changelog_records < count:
        raise SystemExit(f"FAILED: the changelog holds {changelog_records} records, fewer than {count}")

    deleted = app.clear_state()
    if not deleted or (app.app_dir() / STORE).exists():
        raise SystemExit(f"FAILED: clear_state did not delete the local state under {app.app_dir()}")
    print(f"deleted local state: {', '.join(str(path) for path in deleted)}")

    listener = CountingRestoreListener()
    app.add_restore_listener(listener)
    report, wall, marks = run_measured(app, args.profile, f"restoring {count:,} keys")
    check_report(report, 0, "restore run")
    restores = report.restores
    applied = sum(r.records_applied for r in restores)
    skipped = sum(r.records_skipped for r in restores)
    restore_seconds = listener.seconds  # the span: restores in child processes overlap
    for r in sorted(restores, key=lambda r: r.partition):
        print(
            f"  partition {r.partition}: {r.kind}, offsets {r.start_offset}..{r.end_offset}, "
            f"{r.records_applied:,} applied, {r.records_skipped:,} skipped, {r.seconds:.2f} s"
        )
    if (
        len(restores) != args.partitions
        or applied != count
        or listener.records != applied
        or listener.partitions_started != args.partitions
    ):
        raise SystemExit(
            f"FAILED: expected {args.partitions} full restores applying {count} records; got "
            f"{len(restores)} restores applying {applied} (listener saw {listener.records} in "
            f"{listener.batches} batches)"
        )
    print(
        f"restored: {applied:,} records ({skipped:,} skipped) in {restore_seconds:.2f} s "
        f"({listener.batches} batches seen by the RestoreListener)"
    )
    print(f"RESTORE THROUGHPUT: {applied / restore_seconds:,.0f} records/s")
    print(
        f"SECONDS UNTIL PROCESSING RESUMES: {wall:.2f} s (wall of the run_worker that restored; "
        f"stop: {report.stop_reason})"
    )
    print(describe_marks(marks, wall))
    if "running" in marks:
        print(
            f"(the worker entered RUNNING, i.e. could process again, {marks['running']:.2f} s after run_worker "
            f"started; the rest of the wall is the caught-up check, final lag query and close)"
        )

    stored = read_store(app, args.partitions)
    rng = random.Random(7)
    sample = rng.sample(range(count), min(SAMPLE_SIZE, count))
    wrong = [i for i in sample if stored.get(b"k%08d" % i) is None or orjson.loads(stored[b"k%08d" % i]) != amount(i)]
    if len(stored) != count or wrong:
        raise SystemExit(
            f"FAILED: restored store holds {len(stored)} keys (expected {count}); "
            f"{len(wrong)} of {len(sample)} sampled values wrong"
        )
    print(f"check: restored store holds all {count:,} keys; {len(sample):,} sampled values are right")


# ----------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages in the processing phase")
    parser.add_argument("--keys", type=int, default=10_000, help="distinct keys in the processing phase")
    parser.add_argument(
        "--restore-keys", type=int, default=1_000_000, help="keys in the restored store (0 skips the restore phase)"
    )
    parser.add_argument("--partitions", type=int, default=6, help="partitions of the source topics")
    parser.add_argument("--commit-interval", type=float, default=5.0, help="App commit_interval (s)")
    parser.add_argument("--commit-every", type=int, default=50_000, help="App commit_every (messages)")
    parser.add_argument("--restore-batch-size", type=int, default=10_000, help="App restore_batch_size")
    parser.add_argument(
        "--restore-processes", type=int, default=None, help="App restore_processes (default: one per core)"
    )
    parser.add_argument(
        "--guarantee", choices=["at-least-once", "exactly-once"], default="at-least-once", help="processing_guarantee"
    )
    parser.add_argument(
        "--aggregate",
        action="store_true",
        help='keep the totals with the columnar aggregate(Sum("amount")) instead of a stateful apply calling '
        "state.get and state.set",
    )
    parser.add_argument(
        "--aggregate-per-message",
        action="store_true",
        help="keep the totals with aggregate(Sum(function of the order)), folded message by message",
    )
    parser.add_argument("--output", action="store_true", help="send each running total to an output topic")
    parser.add_argument("--broker-heap", default="1g", help="heap of the local broker (when one is started)")
    parser.add_argument("--profile", action="store_true", help="run the measured run_worker calls under cProfile")
    parser.add_argument("--skip-processing", action="store_true", help="only run the restore phase")
    parser.add_argument("--log-level", default="WARNING", help="level of the engine's logging (INFO shows restores)")
    args = parser.parse_args()
    if args.messages <= 0 or args.keys <= 0 or args.partitions <= 0 or args.restore_keys < 0:
        parser.error("--messages, --keys and --partitions must be positive, --restore-keys >= 0")
    return args


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    print_machine()
    print("== settings")
    print(f"messages:            {args.messages:,}{' (processing phase skipped)' if args.skip_processing else ''}")
    print(f"keys:                {args.keys:,}")
    print(f"restore keys:        {args.restore_keys:,}{' (restore phase skipped)' if not args.restore_keys else ''}")
    print(f"partitions:          {args.partitions}")
    print(f"commit_interval:     {args.commit_interval} s")
    print(f"commit_every:        {args.commit_every:,} messages")
    print(f"restore batch size:  {args.restore_batch_size:,}")
    print(f"restore processes:   {args.restore_processes or os.cpu_count()}")
    print(f"guarantee:           {args.guarantee}; output topic: {'yes' if args.output else 'no'}")
    print(f"state serde / value: json / json (orjson); store: one ({STORE!r}), state key 'total' per message key")
    print(f"input producer:      {PRODUCER_SETTINGS}")
    print(f"kafka:               {external or f'local broker started for this run (heap {args.broker_heap})'}")
    print(f"profile:             {args.profile}")
    print(f"engine revision:     {engine_revision()}")

    with bench_broker("bench-core-", args.broker_heap) as (bootstrap, scratch_dir):
        run_id = uuid.uuid4().hex[:8]
        state_dir = scratch_dir / "state"
        if not args.skip_processing:
            processing_phase(bootstrap, state_dir, run_id, args)
        if args.restore_keys:
            restore_phase(bootstrap, state_dir, run_id, args)


if __name__ == "__main__":
    main()
