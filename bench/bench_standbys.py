"""Time until processing resumes after a member of a group is SIGKILLed, with and without standby replicas.

Two members of one app (the columnar running total of bench_compare.py, `aggregate(Sum("amount"))`
into store "totals" with its changelog), each in a process of its own with a state directory of
its own (as pods with their own volumes), process --keys orders (one per key, so the store holds
--keys keys) over --partitions partitions. With `num_standby_replicas=1` each keeps the other's
partitions as standbys. Once the group has committed everything (and, with standbys, the second
member's standbys have reached their changelogs' ends), the first member is SIGKILLed. Measured on
the survivor, from the kill, by its state listener: when the group gave it the dead member's
partitions (its session timeout, --session-timeout-ms, dominates), and when processing resumed
(every restore done: the whole changelog of those partitions without standbys, the tail since
the standby's position with them); and the records its restores applied. The survivor's store is
then read back and checked against the totals recomputed from the orders. The machine and all
settings are printed first.

    .venv/bin/python bench/bench_standbys.py                  # 1M keys, 6 partitions
    .venv/bin/python bench/bench_standbys.py --keys 100000    # a quick run
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from bench_restore import bench_broker, print_machine
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from engine_totals import STORE, TOTAL, read_totals

from dagster_stateful.core import App, AppState, RestoreListener, Sum
from dagster_stateful.core.kafka.clients import KafkaClients

WAIT_SECONDS = 600


@dataclass
class Member:
    """A member process and the events it printed, with their wall-clock times."""

    process: subprocess.Popen[bytes]
    events: list[tuple[float, dict]] = field(default_factory=list)

    def read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(b"{"):
                self.events.append((time.time(), json.loads(line)))

    def first(self, kind: str, after: float, value: str | None = None) -> float | None:
        return next(
            (t for t, e in self.events if t >= after and e["event"] == kind and value in (None, e.get("state"))), None
        )


@dataclass(frozen=True)
class Figure:
    standbys: int
    seconds_until_assigned: float
    seconds_until_processing: float
    records_restored: int


def main() -> None:
    args = parse_args()
    if args.member is not None:
        run_member(args)
        return
    print_machine()
    print(
        f"settings: {args.keys:,} keys (one order each), {args.partitions} partitions, 2 members with state "
        f"directories of their own, session.timeout.ms {args.session_timeout_ms}, commit interval "
        f"{args.commit_interval} s, the first member SIGKILLed once everything is committed"
    )
    with bench_broker("bench-standbys-") as (bootstrap, work):
        figures = [run_variant(args, bootstrap, work, standbys) for standbys in (0, 1)]
    print()
    print(
        "| standbys | seconds from the kill until assigned | until processing resumed | restoring | records restored |"
    )
    print("|---|---|---|---|---|")
    for f in figures:
        restoring = f.seconds_until_processing - f.seconds_until_assigned
        print(
            f"| {f.standbys} | {f.seconds_until_assigned:.1f} | {f.seconds_until_processing:.1f} | {restoring:.2f} "
            f"| {f.records_restored:,} |"
        )


def create_source(bootstrap: str, partitions: int) -> str:
    topic = f"bench-standbys-orders-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result()
    return topic


def produce_orders(bootstrap: str, topic: str, keys: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1 << 20})
    began = time.monotonic()
    for i in range(keys):
        while True:
            try:
                producer.produce(topic, orjson.dumps({"amount": amount(i)}), f"k{i}".encode())
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush()
    print(f"produced {keys:,} orders to {topic} in {time.monotonic() - began:.1f} s")


def amount(i: int) -> int:
    return 1 + i % 7


def run_variant(args: argparse.Namespace, bootstrap: str, work: Path, standbys: int) -> Figure:
    """The orders are produced once both members hold partitions, so that each processes its own (a
    member alone would process them all and keep every partition's state)."""
    name = f"bench-standbys-{standbys}-{uuid.uuid4().hex[:6]}"
    kafka = KafkaClients({"bootstrap.servers": bootstrap})
    source = create_source(bootstrap, args.partitions)
    members = [start_member(args, bootstrap, source, name, work / name / f"member-{i}", standbys) for i in (0, 1)]
    try:
        wait(lambda: _both_assigned(kafka, name, source), "both members to hold partitions")
        produce_orders(bootstrap, source, args.keys)
        began = time.monotonic()
        group = wait(lambda: _settled(kafka, name, source, args.partitions), "the group to commit every order")
        print(f"[standbys {standbys}] both members processed {args.keys:,} orders in {time.monotonic() - began:.1f} s")
        moved = next(sorted(m.partitions) for m in group.members if m.client_id.endswith(f"member-{0}"))
        if standbys:
            wait(lambda: _standbys_at_end(kafka, name, work / name / "member-1", moved), "the standbys to catch up")
        killed = time.time()
        os.kill(members[0].process.pid, signal.SIGKILL)
        survivor = members[1]
        resumed = wait(lambda: _resumed(survivor, killed), "the survivor to resume processing")
        assigned = survivor.first("state", killed, AppState.REBALANCING.value) or resumed
        survivor.process.send_signal(signal.SIGTERM)
        survivor.process.wait(120)
        restored = sum(e["records"] for t, e in survivor.events if t >= killed and e["event"] == "restore_end")
        check_totals(args, bootstrap, source, name, work / name / "member-1", moved)
        figure = Figure(standbys, assigned - killed, resumed - killed, restored)
        print(
            f"[standbys {standbys}] assigned {figure.seconds_until_assigned:.1f} s after the kill, processing "
            f"resumed after {figure.seconds_until_processing:.1f} s, {restored:,} records restored"
        )
        return figure
    finally:
        for member in members:
            if member.process.poll() is None:
                member.process.kill()
                member.process.wait(30)


def start_member(
    args: argparse.Namespace, bootstrap: str, source: str, name: str, state_dir: Path, standbys: int
) -> Member:
    command = [sys.executable, __file__, "--member", name, "--bootstrap", bootstrap, "--source", source]
    command += ["--state-dir", str(state_dir), "--standbys", str(standbys), "--keys", str(args.keys)]
    command += ["--session-timeout-ms", str(args.session_timeout_ms), "--commit-interval", str(args.commit_interval)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, cwd=Path(__file__).parent)
    member = Member(process)
    threading.Thread(target=member.read, daemon=True).start()
    return member


def _both_assigned(kafka: KafkaClients, group_name: str, source: str) -> bool:
    group = kafka.describe_group(group_name, source)
    return group.state == "STABLE" and len([m for m in group.members if m.partitions]) == 2


def _settled(kafka: KafkaClients, group_name: str, source: str, partitions: int):
    group = kafka.describe_group(group_name, source)
    owned = [m for m in group.members if m.partitions]
    if group.state != "STABLE" or len(owned) != 2:
        return None
    highs = kafka.watermarks(source, range(partitions))
    committed = kafka.committed_offsets(group_name, source, range(partitions))
    return group if all(committed.get(p) == highs[p][1] for p in range(partitions)) else None


def _standbys_at_end(kafka: KafkaClients, name: str, state_dir: Path, partitions: list[int]) -> bool:
    app = member_app(name, "unused", state_dir, kafka, 1)
    highs = kafka.watermarks(app.changelog_topic(STORE), partitions)
    checkpoints = [app.state.read_checkpoint(STORE, p) for p in partitions]
    return all(
        c is not None and c.changelog_offset == highs[p][1] for p, c in zip(partitions, checkpoints, strict=True)
    )


def _resumed(member: Member, killed: float) -> float | None:
    rebalancing = member.first("state", killed, AppState.REBALANCING.value)
    return None if rebalancing is None else member.first("state", rebalancing, AppState.RUNNING.value)


def check_totals(
    args: argparse.Namespace, bootstrap: str, source: str, name: str, state_dir: Path, moved: list[int]
) -> None:
    """The survivor's store holds every key's total, the moved partitions' included."""
    app = member_app(name, source, state_dir, KafkaClients({"bootstrap.servers": bootstrap}), 0)
    totals = read_totals(app, args.partitions)
    wrong = [i for i in range(args.keys) if totals.get(f"k{i}") != amount(i)]
    if wrong or len(totals) != args.keys:
        raise SystemExit(f"FAILED: {len(wrong):,} keys have a wrong total, {len(totals):,} keys held (moved: {moved})")
    print(f"checked: the survivor holds all {args.keys:,} totals")


def member_app(name: str, source: str, state_dir: Path, kafka: KafkaClients, standbys: int, **settings) -> App:
    app = App(
        name=name,
        source=source,
        stores=[STORE],
        state_dir=state_dir,
        kafka=kafka,
        num_standby_replicas=standbys,
        **settings,
    )
    app.dataframe().aggregate(Sum("amount"), name=TOTAL)
    return app


class PrintedRestores(RestoreListener):
    def on_restore_end(self, partition: int, store: str, total_restored: int) -> None:
        emit({"event": "restore_end", "partition": partition, "records": total_restored})


def emit(event: dict) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def run_member(args: argparse.Namespace) -> None:
    session = args.session_timeout_ms
    app = member_app(
        args.member,
        args.source,
        args.state_dir,
        KafkaClients({"bootstrap.servers": args.bootstrap}),
        args.standbys,
        commit_interval=args.commit_interval,
        consumer_config={"session.timeout.ms": session, "heartbeat.interval.ms": max(100, session // 6)},
    )
    app.add_restore_listener(PrintedRestores())
    app.add_state_listener(lambda new, old: emit({"event": "state", "state": new.value}))
    app.run_worker(until_caught_up=False, max_seconds=WAIT_SECONDS)


def wait(condition, what: str):
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.2)
    raise SystemExit(f"FAILED: timed out after {WAIT_SECONDS} s waiting for {what}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--commit-interval", type=float, default=1.0)
    parser.add_argument("--member", help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    parser.add_argument("--state-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--standbys", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args()


if __name__ == "__main__":
    main()
