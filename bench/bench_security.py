"""What security costs: the running-total workload over SASL_SSL (SCRAM-SHA-512 over TLS) against PLAINTEXT.

The workload is bench_core.py's processing phase: an App with one store keeping a running total per
key (a stateful `apply` calling `state.get("total")` and `state.set(...)` per message, changelogs
on) consumes --messages JSON orders over --keys keys in --partitions partitions with a bounded
worker (`run_worker(until_caught_up=True)`).

One secured development broker is started (`LocalKafkaBroker(home, BrokerSettings(secured=True))`,
see dagster_stateful/local_kafka/secured.py). Both variants talk to that same broker, same disk,
same JVM, so the comparison isolates the listener's security:

- PLAINTEXT: its internal plain-text listener (principal `User:ANONYMOUS`, a super user);
- SASL_SSL: its SASL_SSL listener, TLS with the broker's private CA and SCRAM-SHA-512, as
  `--sasl-user app` (default): a SCRAM user holding exactly the ACLs `required_acls` lists for
  each run's app, granted before the run (what production runs: ACLs are checked per request), or
  `--sasl-user developer`: the broker's development super user (no ACL look-ups).

The source topic is produced once, through the plain-text listener; every run consumes all of it
with a fresh app name (its own consumer group, changelog and state directory), in this process,
as bench_core.py runs its workers. The variants alternate run by run (PLAINTEXT, SASL_SSL,
SASL_SSL, PLAINTEXT, ...: the order flips each repetition), --repetitions times each, after
--warmups unmeasured runs of each. Every run's totals are checked against the ones recomputed from
the source (all keys); a wrong answer fails the script.

Per run: messages/s from the worker's report (processed / `WorkerReport.seconds`, start-up, group
join and the final commit included); messages/s of the processing loop alone (from the worker
entering RUNNING until it saw it was caught up); messages per CPU-second of this process (all its
threads: `time.process_time`), split into the thread that ran the worker (`time.thread_time`:
Python, the steps, RocksDB calls) and the others (librdkafka's, where TLS runs, and RocksDB's);
the commits' seconds (`WorkerReport.commit_latency`); the broker's CPU seconds (from /proc). The
table gives each variant's medians per run and their ratios, SASL_SSL / PLAINTEXT.

    .venv/bin/python bench/bench_security.py                            # 300k messages, 5 repetitions
    .venv/bin/python bench/bench_security.py --guarantee exactly-once
    .venv/bin/python bench/bench_security.py --messages 3000 --repetitions 1 --warmups 0   # a smoke run

It always starts its own secured broker (KAFKA_BOOTSTRAP_SERVERS is not used: it needs both
listeners of one broker).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import secrets
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka
import orjson
from bench_core import (
    amount,
    check_report,
    create_topic,
    engine_revision,
    load,
    make_app,
    print_machine,
    produce_orders,
    read_store,
    run_measured,
)

from dagster_stateful.core import App
from dagster_stateful.core.kafka.security.acls import acl_bindings, required_acls
from dagster_stateful.local_kafka.broker import BrokerSettings, LocalKafkaBroker
from dagster_stateful.local_kafka.secured import DEVELOPER, SCRAM_MECHANISM, SecuredEndpoints, developer_password

PLAINTEXT, SASL_SSL = "PLAINTEXT", "SASL_SSL"
APP_USER = "bench-app"
AIM = 0.85
"""The aim: SASL_SSL within 15% of PLAINTEXT's throughput."""


@dataclass(frozen=True)
class Variant:
    name: str
    bootstrap: str
    settings: dict[str, Any] | None = None
    """librdkafka connection settings; None: the bootstrap address alone."""
    principal: str | None = None
    """Whom to grant each run's app its ACLs (None: a super user, no grants)."""


@dataclass(frozen=True)
class RunResult:
    variant: str
    processed: int
    seconds: float
    """`WorkerReport.seconds`: the whole bounded run."""
    cpu_seconds: float
    """CPU time of this process (every thread) over the run."""
    main_cpu_seconds: float
    """CPU time of the thread that ran the worker (Python, the steps, RocksDB calls, polling)."""
    commit_seconds: float
    """The commits' time (`WorkerReport.commit_latency`: samples x mean)."""
    loop_seconds: float | None
    """From the worker entering RUNNING until its loop saw it was caught up."""
    broker_cpu_seconds: float
    load_1min: float

    @property
    def rate(self) -> float:
        return self.processed / self.seconds

    @property
    def cpu_rate(self) -> float:
        return self.processed / self.cpu_seconds

    @property
    def loop_rate(self) -> float | None:
        return self.processed / self.loop_seconds if self.loop_seconds else None


@dataclass
class Bench:
    """What every run shares: the broker, the source and its expected totals, the settings."""

    args: argparse.Namespace
    endpoints: SecuredEndpoints
    broker_pid: int
    source: str
    expected: dict[bytes, int]
    state_root: Path
    run_id: str


# ----------------------------------------------------------------------------------------------
# The broker, the variants and the input


@contextmanager
def secured_broker(heap: str) -> Iterator[tuple[LocalKafkaBroker, Path]]:
    """A scratch directory and a secured broker started in it (stopped and deleted on exit)."""
    work = Path(tempfile.mkdtemp(prefix="bench-security-"))
    broker = LocalKafkaBroker(work / "kafka", BrokerSettings(secured=True, heap=heap))
    try:
        began = time.monotonic()
        broker.start(tie_to_parent=True)
        endpoints = broker.endpoints()
        print(
            f"broker: SASL_SSL at {endpoints.sasl_ssl}, PLAINTEXT (internal) at {endpoints.internal}, "
            f"started in {time.monotonic() - began:.1f} s"
        )
        yield broker, work
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


def make_variants(endpoints: SecuredEndpoints, sasl_user: str) -> dict[str, Variant]:
    if sasl_user == "developer":
        settings = endpoints.sasl_settings(DEVELOPER, developer_password(endpoints.home))
        sasl = Variant(SASL_SSL, endpoints.sasl_ssl, settings)
    else:
        password = secrets.token_urlsafe(16)
        endpoints.admin().add_user(APP_USER, password)
        sasl = Variant(SASL_SSL, endpoints.sasl_ssl, endpoints.sasl_settings(APP_USER, password), f"User:{APP_USER}")
    return {PLAINTEXT: Variant(PLAINTEXT, endpoints.internal), SASL_SSL: sasl}


def produce_source(bootstrap: str, args: argparse.Namespace, run_id: str) -> tuple[str, dict[bytes, int]]:
    """The source topic, produced once through `bootstrap`, and every key's expected total."""
    source = f"bench-security-orders-{run_id}"
    create_topic(bootstrap, source, args.partitions)
    customers = [f"c{k}" for k in range(args.keys)]
    seconds = produce_orders(bootstrap, source, args.messages, lambda i: customers[i % args.keys])
    print(f"produce: {args.messages:,} messages in {seconds:.1f} s over PLAINTEXT (not measured)")
    expected: dict[bytes, int] = {}
    for i in range(args.messages):
        key = customers[i % args.keys].encode()
        expected[key] = expected.get(key, 0) + amount(i)
    return source, expected


def schedule(repetitions: int) -> list[str]:
    """PLAINTEXT, SASL_SSL, SASL_SSL, PLAINTEXT, ...: each repetition a pair, its order flipped each time."""
    pairs = [(PLAINTEXT, SASL_SSL) if rep % 2 == 0 else (SASL_SSL, PLAINTEXT) for rep in range(repetitions)]
    return [variant for pair in pairs for variant in pair]


# ----------------------------------------------------------------------------------------------
# One run


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # fields 14 and 15 of stat(5)


def prepare_app(bench: Bench, variant: Variant, number: int) -> App:
    """A fresh app (own name, group, changelog and state directory) connected as `variant` says."""
    name = f"bench-security-{bench.run_id}-{number}-{variant.name.lower().replace('_', '-')}"
    app = make_app(variant.bootstrap, name, bench.source, bench.state_root / name, bench.args)
    if variant.settings is not None:
        app = app.bind(kafka=variant.settings)
    if variant.principal is not None:
        bench.endpoints.admin().grant(acl_bindings(required_acls(app.config, app.topic_specs()), variant.principal))
    return app


def check_totals(app: App, bench: Bench) -> None:
    stored = read_store(app, bench.args.partitions)
    wrong = [key for key, total in bench.expected.items() if key not in stored or orjson.loads(stored[key]) != total]
    if wrong or len(stored) != len(bench.expected):
        raise SystemExit(
            f"FAILED ({app.name}): totals wrong for {len(wrong)} of {len(bench.expected)} keys "
            f"(store holds {len(stored)}); first: {[key.decode() for key in wrong[:5]]}"
        )


def measured_run(bench: Bench, variant: Variant, label: str, number: int) -> RunResult:
    """One bounded worker of a fresh app over the whole source, timed; its totals checked."""
    app = prepare_app(bench, variant, number)
    gc.collect()
    broker_began, cpu_began, main_began = process_cpu_seconds(bench.broker_pid), time.process_time(), time.thread_time()
    report, _wall, marks = run_measured(app, False, f"{label}, {variant.name}")
    cpu_seconds, main_cpu_seconds = time.process_time() - cpu_began, time.thread_time() - main_began
    broker_cpu_seconds = process_cpu_seconds(bench.broker_pid) - broker_began
    check_report(report, bench.args.messages, label)
    check_totals(app, bench)
    shutil.rmtree(bench.state_root / app.name, ignore_errors=True)
    loop = marks["loop_done"] - marks["running"] if "running" in marks and "loop_done" in marks else None
    commits = report.commit_latency
    result = RunResult(
        variant=variant.name,
        processed=report.total_processed,
        seconds=report.seconds,
        cpu_seconds=cpu_seconds,
        main_cpu_seconds=main_cpu_seconds,
        commit_seconds=commits.samples * commits.mean_seconds,
        loop_seconds=loop,
        broker_cpu_seconds=broker_cpu_seconds,
        load_1min=os.getloadavg()[0],
    )
    print(describe_run(label, result))
    return result


def describe_run(label: str, run: RunResult) -> str:
    loop = f"{run.loop_rate:,.0f} msg/s in the loop ({run.loop_seconds:.2f} s)" if run.loop_rate else "loop n/a"
    return (
        f"{label} {run.variant}: {run.processed:,} messages in {run.seconds:.2f} s = {run.rate:,.0f} msg/s; "
        f"{run.cpu_seconds:.2f} CPU-s = {run.cpu_rate:,.0f} msg/CPU-s (worker thread {run.main_cpu_seconds:.2f}, "
        f"other threads {run.cpu_seconds - run.main_cpu_seconds:.2f}); {loop}; commits {run.commit_seconds:.2f} s; "
        f"broker {run.broker_cpu_seconds:.2f} CPU-s; load {run.load_1min:.2f}"
    )


def run_all(bench: Bench, variants: dict[str, Variant]) -> list[RunResult]:
    """The warm-ups (of each variant, not counted), then the measured runs in `schedule`'s order."""
    warmups = [name for _ in range(bench.args.warmups) for name in (PLAINTEXT, SASL_SSL)]
    for i, name in enumerate(warmups):
        measured_run(bench, variants[name], f"warm-up {i + 1}/{len(warmups)}", number=i)
    order = schedule(bench.args.repetitions)
    return [
        measured_run(bench, variants[name], f"run {i + 1}/{len(order)}", number=len(warmups) + i)
        for i, name in enumerate(order)
    ]


# ----------------------------------------------------------------------------------------------
# Report


COLUMNS: list[tuple[str, str, str]] = [
    ("msg/s in the processing loop", "loop_rate", ",.0f"),
    ("msg per CPU-s of the worker process", "cpu_rate", ",.0f"),
    ("worker thread CPU-s", "main_cpu", ".2f"),
    ("other threads' CPU-s (librdkafka, RocksDB)", "other_cpu", ".2f"),
    ("commits, s", "commits", ".2f"),
    ("broker CPU-s", "broker_cpu", ".2f"),
]
"""The table's columns after msg/s: header, key of `medians`, format of a median (all per run)."""


def medians(runs: Sequence[RunResult]) -> dict[str, float]:
    loops = [run.loop_rate for run in runs if run.loop_rate]
    return {
        "rate": statistics.median(run.rate for run in runs),
        "loop_rate": statistics.median(loops) if loops else float("nan"),
        "cpu_rate": statistics.median(run.cpu_rate for run in runs),
        "main_cpu": statistics.median(run.main_cpu_seconds for run in runs),
        "other_cpu": statistics.median(run.cpu_seconds - run.main_cpu_seconds for run in runs),
        "commits": statistics.median(run.commit_seconds for run in runs),
        "broker_cpu": statistics.median(run.broker_cpu_seconds for run in runs),
    }


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


def print_table(results: list[RunResult]) -> float:
    """The Markdown table of medians per run and their ratios; returns the ratio of the msg/s medians."""
    by_variant = {name: [run for run in results if run.variant == name] for name in (PLAINTEXT, SASL_SSL)}
    summary = {name: medians(runs) for name, runs in by_variant.items()}
    print("\n| variant | runs | msg/s, median (min-max) | " + " | ".join(header for header, _, _ in COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 3) + "|")
    for name, runs in by_variant.items():
        rates, row = [run.rate for run in runs], summary[name]
        cells = [f"{row[key]:{spec}}" for _, key, spec in COLUMNS]
        print(
            f"| {name} | {len(runs)} | {row['rate']:,.0f} ({min(rates):,.0f}-{max(rates):,.0f}) | {' | '.join(cells)} |"
        )
    ratios = {key: ratio(summary[SASL_SSL][key], summary[PLAINTEXT][key]) for key in summary[PLAINTEXT]}
    cells = [f"{ratios[key]:.3f}" for _, key, _ in COLUMNS]
    print(f"| {SASL_SSL} / {PLAINTEXT} | | {ratios['rate']:.3f} | {' | '.join(cells)} |")
    return ratios["rate"]


def paired_ratios(results: list[RunResult]) -> list[float]:
    """Each repetition's SASL_SSL rate over its PLAINTEXT rate (the two runs next to each other)."""
    pairs = [results[i : i + 2] for i in range(0, len(results) - 1, 2)]
    return [
        next(r.rate for r in pair if r.variant == SASL_SSL) / next(r.rate for r in pair if r.variant == PLAINTEXT)
        for pair in pairs
    ]


def print_verdict(rate_ratio: float, results: list[RunResult]) -> None:
    paired = paired_ratios(results)
    loads = [run.load_1min for run in results]
    direction = "slower" if rate_ratio < 1 else "faster"
    print(
        f"\nRATIO SASL_SSL / PLAINTEXT (medians of msg/s): {rate_ratio:.3f}, i.e. SASL_SSL "
        f"{abs(1 - rate_ratio) * 100:.1f}% {direction}; the aim (within {(1 - AIM) * 100:.0f}%): "
        f"{'met' if rate_ratio >= AIM else 'NOT met'}"
    )
    each = ", ".join(f"{r:.3f}" for r in paired)
    print(f"median of the repetitions' own ratios: {statistics.median(paired):.3f} ({each})")
    print(f"1-min load avg after each run: median {statistics.median(loads):.2f}, {min(loads):.2f}-{max(loads):.2f}")


def print_settings(args: argparse.Namespace, broker: LocalKafkaBroker) -> None:
    print("== settings")
    print(f"messages:          {args.messages:,} JSON orders over {args.keys:,} keys in {args.partitions} partitions")
    print("workload:          stateful apply, state.get('total') + state.set(...) per message, changelogs on")
    print(f"commit:            commit_interval {args.commit_interval} s, commit_every {args.commit_every:,} messages")
    print(f"guarantee:         {args.guarantee}")
    print(
        f"runs:              {args.warmups} warm-up(s) of each variant, then {args.repetitions} repetitions of "
        f"each, alternating (PLAINTEXT, SASL_SSL, SASL_SSL, PLAINTEXT, ...), in this process"
    )
    sasl_as = (
        f"user {APP_USER!r} holding exactly its ACLs (required_acls)"
        if args.sasl_user == "app"
        else f"user {DEVELOPER!r} (a super user)"
    )
    print(f"SASL_SSL:          {SCRAM_MECHANISM} over TLS (broker's private CA, ECDSA certificate), as {sasl_as}")
    print("PLAINTEXT:         the same broker's internal plain-text listener (User:ANONYMOUS, a super user)")
    print(f"broker:            Kafka {broker.settings.kafka_version}, one node, heap {broker.settings.heap}")
    print(f"librdkafka:        {confluent_kafka.libversion()[0]} (confluent-kafka {confluent_kafka.version()})")
    print(f"engine revision:   {engine_revision()}")


# ----------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=300_000, help="messages in the source topic")
    parser.add_argument("--keys", type=int, default=10_000, help="distinct keys")
    parser.add_argument("--partitions", type=int, default=3, help="partitions of the source topic")
    parser.add_argument("--repetitions", type=int, default=5, help="measured runs of each variant")
    parser.add_argument("--warmups", type=int, default=1, help="unmeasured runs of each variant first")
    parser.add_argument("--commit-interval", type=float, default=5.0, help="App commit_interval (s)")
    parser.add_argument("--commit-every", type=int, default=50_000, help="App commit_every (messages)")
    parser.add_argument(
        "--guarantee", choices=["at-least-once", "exactly-once"], default="at-least-once", help="processing_guarantee"
    )
    parser.add_argument(
        "--sasl-user",
        choices=["app", "developer"],
        default="app",
        help="SASL_SSL as a user holding exactly the app's ACLs, or as the broker's super user",
    )
    parser.add_argument("--broker-heap", default="1g", help="heap of the broker")
    parser.add_argument("--log-level", default="WARNING", help="level of the engine's logging")
    # What bench_core.make_app reads:
    parser.set_defaults(aggregate=False, aggregate_per_message=False, output=False, restore_batch_size=10_000)
    args = parser.parse_args()
    if min(args.messages, args.keys, args.partitions, args.repetitions) <= 0 or args.warmups < 0:
        parser.error("--messages, --keys, --partitions and --repetitions must be positive, --warmups >= 0")
    return args


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print_machine()
    with secured_broker(args.broker_heap) as (broker, work):
        print_settings(args, broker)
        endpoints = broker.endpoints()
        pid = broker.status().pid
        if pid is None:
            raise SystemExit("FAILED: the broker's process id is unknown")
        run_id = uuid.uuid4().hex[:8]
        source, expected = produce_source(endpoints.internal, args, run_id)
        bench = Bench(args, endpoints, pid, source, expected, work / "state", run_id)
        results = run_all(bench, make_variants(endpoints, args.sasl_user))
    rate_ratio = print_table(results)
    print_verdict(rate_ratio, results)
    print(f"load avg at the end: {load()}")


if __name__ == "__main__":
    main()
