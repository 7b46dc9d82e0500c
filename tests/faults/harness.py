"""Fault injection for the engine: worker subprocesses with kill points, orders, and the lost/doubled count.

Owns the mechanics the fault suite (tests/faults/) and bench/bench_faults.py share:
- `WorkerProcess`: a real worker of the counting app (`counting_worker`, run as a script) in a
  subprocess, optionally as another (unprivileged) user, whose `EVENT` lines (state transitions,
  restore batches, source commits, progress, the report or the error) are read as they come, so
  that a test waits for exactly the moment it wants to strike, with a timeout.
- `KillPoint` and `inject`: SIGKILL mid-batch (after some messages of this run, plus a random
  delay), mid-restore (after some restored batches), or inside the commit (the worker kills itself
  at its n-th commit: before delivery, between delivery and the source commit, or between the
  source commit and the RocksDB write).
- Orders (`make_orders`, `OrderFeeder` for live traffic) and the judgement: the count and total
  per customer recomputed from the source topic read back (`expected_from_source`), the store's
  content (`read_counts`), and `compare`: "lost" = sum over customers of max(0, expected - count),
  "doubled" = sum of max(0, count - expected).
- For a windowed worker: orders with event times (`TimedOrders`), the tumbling windows recomputed
  from the source topic (`replay_windows`), and `check_windows`: every closed window in the output
  topic with its recomputed tally, the store's windows and stream times, the late orders dead-lettered.
- What a failed run must not have changed (`progress_of`, `changes`), run summaries, and
  `FaultResult`: a line of the bench's table and what a test asserts on.
- `RestartableBroker`: a broker of one's own, stopped and started again on the same ports.
"""

from __future__ import annotations

import dataclasses
import grp
import json
import os
import pwd
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import IO, Any, TypeVar

import orjson
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from support.kafka_helpers import read_committed, read_messages, wait_for
from support.session_model import replay_sessions
from support.sliding_model import replay_sliding

from dagster_stateful.core.state.keys import is_reserved
from dagster_stateful.core.state.window_state import STREAM_TIME_KEY, split_window_key
from dagster_stateful.local_kafka.broker import BrokerSettings, LocalKafkaBroker
from faults import counting_worker
from faults.counting_worker import STORE, CommitPhase, WorkerSpec, build_app

WORKER_SCRIPT = Path(counting_worker.__file__).resolve()
KILLED = -signal.SIGKILL
QUIET = {"log_level": 2}
"""librdkafka logs only critical trouble: the test's own clients outlive broker outages on purpose."""

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------
# Orders


def make_orders(count: int, customers: int, start: int = 0) -> list[tuple[bytes, bytes]]:
    """Orders `start`..`start + count - 1`, keyed by customer (round robin), amounts 1..7."""
    return [
        (f"c{i % customers}".encode(), orjson.dumps({"id": i, "customer": f"c{i % customers}", "amount": 1 + i % 7}))
        for i in range(start, start + count)
    ]


TimedOrder = tuple[bytes, bytes, int]
"""(key, value, message timestamp in ms): an order with its event time."""


class TimedOrders:
    """Orders with event times, as a windowed app sees them: each order's timestamp `step_ms` (a
    random range) after the last one's, a `lag_share` of them lagging up to `max_lag_ms` behind
    (some within a window's grace, some past it: late). Keyed by a random customer of `customers`,
    ids counting up, amounts 1..7 (as `make_orders`). Successive `next` calls go on where the last
    one stopped, so orders produced between runs carry on the event time."""

    def __init__(
        self,
        customers: int,
        rng: random.Random,
        start_ms: int,
        step_ms: tuple[int, int] = (20, 50),
        lag_share: float = 0.1,
        max_lag_ms: int = 3_000,
    ) -> None:
        self.customers, self.rng, self.clock = customers, rng, start_ms
        self.step_ms, self.lag_share, self.max_lag_ms = step_ms, lag_share, max_lag_ms
        self.produced = 0

    def next(self, count: int) -> list[TimedOrder]:
        orders = []
        for i in range(self.produced, self.produced + count):
            self.clock += self.rng.randint(*self.step_ms)
            lag = self.rng.randrange(self.max_lag_ms) if self.rng.random() < self.lag_share else 0
            customer = f"c{self.rng.randrange(self.customers)}"
            value = orjson.dumps({"id": i, "customer": customer, "amount": 1 + i % 7})
            orders.append((customer.encode(), value, self.clock - lag))
        self.produced += count
        return orders


class PaidOrders:
    """Orders with event times `step_ms` apart keyed by a random customer of `customers` (values
    `{"id": i}`), and payments of most of them (`{"payment": j}`, the same key) up to `pay_within_ms`
    after the order, some twice, produced a slice of event time at a time: each `next` gives the
    orders it makes and the payments made so far no later than its last order, the others kept for
    the next slice, so that neither topic ever goes back in time across slices. Within a slice
    each topic is shuffled by up to `disorder_ms`."""

    def __init__(
        self, customers: int, rng: random.Random, start_ms: int, pay_within_ms: int = 1_500, disorder_ms: int = 400
    ) -> None:
        self.customers, self.rng, self.clock = customers, rng, start_ms
        self.pay_within_ms, self.disorder_ms = pay_within_ms, disorder_ms
        self.produced = self.payments = 0
        self._waiting: list[TimedOrder] = []

    def next(self, count: int) -> tuple[list[TimedOrder], list[TimedOrder]]:
        orders = []
        for i in range(self.produced, self.produced + count):
            self.clock += self.rng.randint(20, 50)
            customer = f"c{self.rng.randrange(self.customers)}".encode()
            orders.append((customer, orjson.dumps({"id": i}), self.clock))
            for _ in range(self.rng.choice([0, 1, 1, 1, 2])):
                at = self.clock + self.rng.randrange(self.pay_within_ms)
                self._waiting.append((customer, orjson.dumps({"payment": self.payments}), at))
                self.payments += 1
        self.produced += count
        due = [payment for payment in self._waiting if payment[2] <= self.clock]
        self._waiting = [payment for payment in self._waiting if payment[2] > self.clock]
        return self._shuffled(orders), self._shuffled(due)

    def _shuffled(self, records: list[TimedOrder]) -> list[TimedOrder]:
        return sorted(records, key=lambda record: record[2] + self.rng.randrange(self.disorder_ms))


def hours_ago(hours: float) -> int:
    """Now minus `hours`, in ms since the epoch: event times old enough to be clearly past, young
    enough that the broker's time retention (7 days) deletes none of their records."""
    return time.time_ns() // 1_000_000 - int(hours * 3_600_000)


def create_topic(bootstrap: str, name: str, partitions: int, config: Mapping[str, str] | None = None) -> None:
    """`support.kafka_helpers.create_topic` with a quiet admin client (it may outlive a broker outage)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    topic = NewTopic(name, num_partitions=partitions, replication_factor=1, config=dict(config or {}))
    admin.create_topics([topic])[name].result(timeout=30)
    wait_for(lambda: name in admin.list_topics(timeout=10).topics, 30, f"topic {name} to appear")


def produce_orders(bootstrap: str, topic: str, orders: Iterable[tuple[bytes, bytes]]) -> None:
    """Produce and wait until Kafka acknowledged every order (fails otherwise)."""
    produce_timed_orders(bootstrap, topic, ((key, value, 0) for key, value in orders), ordered=False)


def produce_timed_orders(bootstrap: str, topic: str, orders: Iterable[TimedOrder], ordered: bool = True) -> None:
    """Produce orders with their timestamps (0: now) and wait until Kafka acknowledged every one
    (fails otherwise). `ordered`: idempotently, so that a retried batch cannot land after a later
    one (which would make every order in it late for its windows)."""
    config = {"enable.idempotence": True} if ordered else {}
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **config, **QUIET})
    errors: list[str] = []

    def on_delivery(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            errors.append(error.str())

    for key, value, timestamp in orders:
        while True:
            try:
                producer.produce(topic, key=key, value=value, timestamp=timestamp, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
    remaining = producer.flush(60)
    assert remaining == 0 and not errors, f"orders not delivered to {topic}: {remaining} unacknowledged, {errors[:5]}"


@dataclass(frozen=True)
class Tally:
    count: int
    total: int


def tally(values: Iterable[bytes | None]) -> dict[str, Tally]:
    """Count and total per customer of the orders whose raw values are given."""
    counts: dict[str, int] = {}
    totals: dict[str, int] = {}
    for value in values:
        assert value is not None, "every order has a value"
        order = orjson.loads(value)
        customer = order["customer"]
        counts[customer] = counts.get(customer, 0) + 1
        totals[customer] = totals.get(customer, 0) + order["amount"]
    return {customer: Tally(counts[customer], totals[customer]) for customer in counts}


def outputs_checked(bootstrap: str, source: str, output: str) -> tuple[int, int]:
    """(missing, extra) outputs: every order of `source` must appear exactly once in `output`, as a
    `read_committed` reader sees it (records of aborted transactions never do)."""
    wanted = Counter(orjson.loads(m.value() or b"null")["id"] for m in source_messages(bootstrap, source))
    seen = Counter(orjson.loads(m.value() or b"null")["id"] for m in read_committed(bootstrap, output, timeout=60))
    return sum((wanted - seen).values()), sum((seen - wanted).values())


def source_messages(bootstrap: str, topic: str) -> list[Message]:
    """Every message still in `topic`, read back from Kafka."""
    return read_messages(bootstrap, topic, timeout=60)


def expected_from_source(bootstrap: str, topic: str) -> dict[str, Tally]:
    """What the store must hold, recomputed from the source topic (never from the code under test)."""
    return tally(message.value() for message in source_messages(bootstrap, topic))


# ---------------------------------------------------------------------------------------------
# The worker, as a subprocess


@dataclass(frozen=True)
class Event:
    kind: str
    data: Any
    at: float
    """time.monotonic() in the test process when the line was read."""


@dataclass(frozen=True)
class WorkerError:
    """The error a worker stopped with: its class, the names of its classes (MRO) and its message."""

    type: str
    classes: tuple[str, ...]
    message: str

    def is_a(self, name: str) -> bool:
        return name in self.classes


@dataclass
class WorkerOutcome:
    exit_code: int
    report: dict[str, Any] | None
    error: WorkerError | None
    started: float
    ended: float
    log_path: Path | None = None

    @property
    def killed(self) -> bool:
        return self.exit_code == KILLED

    @property
    def seconds(self) -> float:
        return self.ended - self.started


_uncommitted_applied: dict[Path, int] = {}
_uncommitted_applied_lock = threading.Lock()


def _note_uncommitted_applied(directory: Path, records: int) -> None:
    with _uncommitted_applied_lock:
        _uncommitted_applied[directory] = _uncommitted_applied.get(directory, 0) + records


def uncommitted_applied_under(directory: Path) -> int:
    """Records of uncommitted messages that the restores of every worker logging under `directory`
    applied (see the worker's `uncommitted_applied` event): at-least-once can double only through them."""
    with _uncommitted_applied_lock:
        return _uncommitted_applied.get(directory, 0)


class WorkerProcess:
    """A worker subprocess whose events are read as they come.

    user: run the worker as this (unprivileged) user when the test runs as root (`setpriv`), so that
    file permissions apply to it.
    """

    def __init__(self, spec: WorkerSpec, log_path: Path, user: str | None = None) -> None:
        self.spec = spec
        self.log_path = log_path
        self.events: list[Event] = []
        self._changed = threading.Condition()
        command = [sys.executable, str(WORKER_SCRIPT), spec.to_json()]
        if user is not None and os.geteuid() == 0:
            command = [*as_user(user), *command]
        self._log = log_path.open("ab")
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
            cwd=WORKER_SCRIPT.parent,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"},
        )
        self._reader = threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[bytes] | None) -> None:
        assert stream is not None, "started with stdout=PIPE"
        for raw in stream:
            line = raw.decode(errors="replace").rstrip("\n")
            if not line.startswith("EVENT "):
                continue
            kind, _, data = line[len("EVENT ") :].partition(" ")
            event = Event(kind, json.loads(data) if data else None, time.monotonic())
            if kind == "uncommitted_applied":
                _note_uncommitted_applied(self.log_path.parent, event.data[2])
            with self._changed:
                self.events.append(event)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Never leave a worker behind (a failed assertion in the middle of a case)."""
        if self.alive:
            self.kill()
            self.process.wait(timeout=30)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        if not self._log.closed:
            self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_for(self, condition: Callable[[list[Event]], T | None], timeout: float, what: str) -> T | None:
        """The first truthy `condition(events)`; None when the worker exits first. Fails after `timeout`."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = condition(self.events)
                if found:
                    return found
                if not self.alive and not self._reader.is_alive():
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; log:\n{self.log_tail()}")
                self._changed.wait(min(left, 0.2))

    def kill(self) -> None:
        """SIGKILL, as a crash or the OOM killer would."""
        if self.alive:
            os.kill(self.process.pid, signal.SIGKILL)

    def pause(self) -> None:
        """SIGSTOP: the worker freezes mid-work, as in a long GC pause or a stalled VM (a zombie to be)."""
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def terminate(self) -> None:
        """SIGTERM: the worker stops cleanly (final commit, close)."""
        if self.alive:
            os.kill(self.process.pid, signal.SIGTERM)

    def finish(self, timeout: float = 180.0) -> WorkerOutcome:
        """Wait for the worker to exit (killed or not) and return what it said."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired as expired:
            self.kill()
            self.process.wait(timeout=30)
            raise AssertionError(
                f"the worker did not exit within {timeout:.0f} s; log:\n{self.log_tail()}"
            ) from expired
        ended = time.monotonic()
        self._reader.join(timeout=30)
        self._log.close()
        report = next((e.data for e in self.events if e.kind == "report"), None)
        error_event = next((e.data for e in self.events if e.kind == "error"), None)
        error = (
            None
            if error_event is None
            else WorkerError(error_event["type"], tuple(error_event["classes"]), error_event["message"])
        )
        return WorkerOutcome(code, report, error, self.started, ended, self.log_path)

    # What the events say.

    def processed(self) -> int:
        """Messages this run processed, as of its last progress event (a multiple of PROGRESS_EVERY)."""
        return max((e.data for e in self.events if e.kind == "progress"), default=0)

    def restoring(self) -> bool:
        """Whether a restore has begun and not ended (nor been suspended)."""
        open_restores: set[tuple[int, str]] = set()
        for event in self.events:
            if event.kind == "restore_start":
                open_restores.add((event.data[0], event.data[1]))
            elif event.kind in ("restore_end", "restore_suspended"):
                open_restores.discard((event.data[0], event.data[1]))
        return bool(open_restores)


def user_group(user: str) -> str:
    """The name of `user`'s primary group."""
    return grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name


def as_user(user: str) -> list[str]:
    """The command prefix that runs a program as `user` (with its group and no other), from root."""
    return ["setpriv", f"--reuid={user}", f"--regid={user_group(user)}", "--clear-groups"]


def run_worker(spec: WorkerSpec, log_path: Path, timeout: float = 180.0, user: str | None = None) -> WorkerOutcome:
    """Run a worker to its end (no fault) and return its outcome."""
    return WorkerProcess(spec, log_path, user).finish(timeout)


# ---------------------------------------------------------------------------------------------
# Kill points


class KillPoint(StrEnum):
    MID_BATCH = "mid-batch"
    MID_RESTORE = "mid-restore"
    COMMIT_BEFORE_DELIVERY = "mid-commit: before delivery"
    COMMIT_BEFORE_OFFSETS = "mid-commit: delivered, offsets not committed"
    COMMIT_AFTER_OFFSETS = "mid-commit: offsets committed, store not written"

    @property
    def commit_phase(self) -> CommitPhase | None:
        return {
            KillPoint.COMMIT_BEFORE_DELIVERY: CommitPhase.BEFORE_DELIVERY,
            KillPoint.COMMIT_BEFORE_OFFSETS: CommitPhase.BEFORE_OFFSETS,
            KillPoint.COMMIT_AFTER_OFFSETS: CommitPhase.AFTER_OFFSETS,
        }.get(self)


def with_kill_point(spec: WorkerSpec, point: KillPoint, rng: random.Random) -> WorkerSpec:
    """The spec a worker needs for `point` (the commit points are armed inside the worker)."""
    phase = point.commit_phase
    if phase is None:
        return spec
    return dataclasses.replace(spec, kill_at_commit=rng.randint(1, 4), kill_phase=phase.value)


@dataclass(frozen=True)
class Injection:
    """What happened to one worker run: where it was aimed, whether it was killed, and where it was seen."""

    point: KillPoint
    killed: bool
    seen: str
    """What the worker was doing when it died, by its events (or how it ended without the kill)."""
    processed: int
    restores_begun: int
    """Store partitions whose restore this run began (whether or not it finished)."""
    outcome: WorkerOutcome


def inject(
    worker: WorkerProcess, point: KillPoint, rng: random.Random, messages: int, timeout: float = 120.0
) -> Injection:
    """Strike `worker` at `point` and wait for it to die.

    MID_BATCH: once the run has processed at least `messages` messages (progress events), after a
    random delay of up to 0.3 s (the worker processes meanwhile). MID_RESTORE: once 1..3 restored
    batches have been reported (or, when the restore is shorter, once processing began), after a
    random part of the restore listener's pause. Commit points: the worker kills itself inside the
    commit it was armed for. A worker that ends by itself first (caught up) is not killed; one that
    fails instead fails the case.
    """
    if point is KillPoint.MID_BATCH:
        reached = worker.wait_for(lambda _: worker.processed() >= messages, timeout, f"{messages} messages processed")
        if reached:
            time.sleep(rng.uniform(0.0, 0.3))
            doing = "processing while restoring" if worker.restoring() else "processing"
            seen = f"{doing} (~{worker.processed()} messages this run)"
            worker.kill()
        else:
            seen = "ended first"
    elif point is KillPoint.MID_RESTORE:
        batches = rng.randint(1, 3)
        reached = worker.wait_for(
            lambda events: sum(1 for e in events if e.kind == "batch") >= batches or worker.processed() > 0,
            timeout,
            f"{batches} restored batches (or processing, when the restore was shorter)",
        )
        if reached:
            time.sleep(rng.uniform(0.0, worker.spec.restore_delay))
            seen = "restoring" if worker.restoring() else "processing after its restore"
            worker.kill()
        else:
            seen = "ended first"
    else:
        seen = f"inside its commit (#{worker.spec.kill_at_commit}: {worker.spec.kill_phase})"
    outcome = worker.finish(timeout)
    if not outcome.killed:
        seen = f"ended first ({outcome.report['stop_reason'] if outcome.report else f'exit {outcome.exit_code}'})"
        if outcome.error is not None:
            raise AssertionError(f"the worker failed instead of being killed: {outcome.error}\n{worker.log_tail()}")
    restores = sum(1 for event in worker.events if event.kind == "restore_start")
    return Injection(point, outcome.killed, seen, worker.processed(), restores, outcome)


# ---------------------------------------------------------------------------------------------
# Windows: recomputed from the source, and what the windowed app emitted and kept

Window = tuple[str, int]
"""(customer, window start in ms)."""


@dataclass
class ReplayedWindows:
    """The tumbling windows recomputed from the source topic (`replay_windows`)."""

    final: dict[Window, dict] = field(default_factory=dict)
    """Every window that closed, with its final tally: what the output topic must hold."""
    kept: dict[Window, dict] = field(default_factory=dict)
    """Windows not expired yet, with their tallies: what the store must hold."""
    late_ids: set[int] = field(default_factory=set)
    """Orders that came after every window they belong to had closed."""
    stream_times: dict[int, int] = field(default_factory=dict)
    """Per partition, the largest event time seen."""
    ends: dict[Window, int] = field(default_factory=dict)
    """Sessions' ends (tumbling windows end at start + size)."""

    def totals_only(self) -> ReplayedWindows:
        """The same windows with their totals alone, as a columnar `Sum("amount")` keeps them."""
        return dataclasses.replace(
            self,
            final={window: {"total": tally["total"]} for window, tally in self.final.items()},
            kept={window: {"total": tally["total"]} for window, tally in self.kept.items()},
        )


def replay_windows(messages: Iterable[Message], size: int, grace: int, retention: int | None = None) -> ReplayedWindows:
    """Tumbling windows of `size` ms with `grace`, kept for `retention` (default size + grace), over
    `messages` (the source as Kafka has it): per partition, in offset order, stream time = the
    largest timestamp seen so far; an order counts in its window unless the window closed already
    (start + size + grace <= the stream time the order brings), else it is late; a window closes
    once stream time reaches start + size + grace, and expires once it reaches start + retention.
    Never computed by the code under test."""
    retention = size + grace if retention is None else retention
    by_partition: dict[int, list[Message]] = {}
    for message in messages:
        by_partition.setdefault(message.partition() or 0, []).append(message)
    replayed = ReplayedWindows()
    for partition, in_partition in by_partition.items():
        stream_time, windows = -1, dict[Window, dict]()
        for message in sorted(in_partition, key=lambda m: m.offset() or 0):
            timestamp, order = message.timestamp()[1], orjson.loads(message.value() or b"null")
            start = timestamp - timestamp % size
            if start + size + grace > max(stream_time, timestamp):
                window = (order["customer"], start)
                kept = windows.get(window, {"count": 0, "total": 0})
                windows[window] = {"count": kept["count"] + 1, "total": kept["total"] + order["amount"]}
            else:
                replayed.late_ids.add(order["id"])
            if timestamp <= stream_time:
                continue
            stream_time = timestamp
            for window in list(windows):
                if window[1] + size + grace <= stream_time:
                    replayed.final.setdefault(window, windows[window])
                if window[1] + retention <= stream_time:
                    del windows[window]
        replayed.kept.update(windows)
        replayed.stream_times[partition] = stream_time
    return replayed


def replay_session_windows(messages: Iterable[Message], gap: int, grace: int) -> ReplayedWindows:
    """`replay_windows` for sessions of `gap` ms with `grace` (retention gap + grace), recomputed by
    `support.session_model.replay_sessions`, partition by partition in offset order."""
    by_partition: dict[int, list[Message]] = {}
    for message in messages:
        by_partition.setdefault(message.partition() or 0, []).append(message)
    replayed = ReplayedWindows()
    for partition, in_partition in by_partition.items():
        orders = [orjson.loads(m.value() or b"null") for m in sorted(in_partition, key=lambda m: m.offset() or 0)]
        times = [m.timestamp()[1] for m in sorted(in_partition, key=lambda m: m.offset() or 0)]
        sessions = replay_sessions(((o["customer"], t, o) for o, t in zip(orders, times, strict=True)), gap, grace)
        for held, session_ids in ((replayed.final, sessions.closed), (replayed.kept, sessions.kept)):
            for window, session in session_ids.items():
                held[window] = {"count": len(session.values), "total": sum(o["amount"] for o in session.values)}
                replayed.ends[window] = session.end
        replayed.late_ids.update(orders[index]["id"] for index in sessions.late)
        replayed.stream_times[partition] = sessions.stream_time
    return replayed


def replay_sliding_windows(messages: Iterable[Message], difference: int, grace: int) -> ReplayedWindows:
    """`replay_windows` for sliding windows of `difference` ms with `grace` (retention difference +
    grace + 1), recomputed by `support.sliding_model.replay_sliding`, partition by partition in
    offset order."""
    by_partition: dict[int, list[Message]] = {}
    for message in messages:
        by_partition.setdefault(message.partition() or 0, []).append(message)
    replayed = ReplayedWindows()
    for partition, in_partition in by_partition.items():
        ordered = sorted(in_partition, key=lambda m: m.offset() or 0)
        orders = [orjson.loads(m.value() or b"null") for m in ordered]
        times = [m.timestamp()[1] for m in ordered]
        windows = replay_sliding(((o["customer"], t, o) for o, t in zip(orders, times, strict=True)), difference, grace)
        for held, found in ((replayed.final, windows.closed), (replayed.kept, windows.kept)):
            for window, values in found.items():
                held[window] = {"count": len(values), "total": sum(o["amount"] for o in values)}
                replayed.ends[window] = window[1] + difference
        replayed.late_ids.update(orders[index]["id"] for index in windows.late)
        replayed.stream_times[partition] = windows.stream_time
    return replayed


def read_windows(spec: WorkerSpec) -> tuple[dict[Window, dict], dict[int, int]]:
    """A windowed app's store (no worker may run): the tally of every window it holds, and each
    partition's stream time (-1: none stored). A window whose retention (size + grace) the stream
    time has reached is gone for every reader of the store: the next commit of its partition
    deletes it (a worker killed after a commit, or one with nothing to process in the partition,
    leaves it there until then)."""
    app = build_app(spec)
    windows: dict[Window, dict] = {}
    stream_times: dict[int, int] = {}
    retention = spec.window_size_ms + spec.window_grace_ms
    if spec.sliding_ms:
        retention = spec.sliding_ms + spec.window_grace_ms + 1
    for partition in range(spec.partitions):
        part = app.state.partition(STORE, partition)
        part.open()
        try:
            held: dict[Window, dict] = {}
            stream_times[partition] = -1
            for key, value in part.items():
                if key == STREAM_TIME_KEY:
                    stream_times[partition] = orjson.loads(value)
                elif not is_reserved(key):  # a sliding store's records are reserved
                    start, customer = split_window_key(key)
                    held[(customer.decode(), start)] = orjson.loads(value)
        finally:
            part.close()
        if spec.session_gap_ms:  # a session's [end, tally], kept until stream time passes end + gap + grace
            retention = spec.session_gap_ms + spec.window_grace_ms
            windows.update({w: tally for w, (end, tally) in held.items() if end + retention >= stream_times[partition]})
        else:
            windows.update({w: t for w, t in held.items() if w[1] + retention > stream_times[partition]})
    return windows, stream_times


@dataclass(frozen=True)
class WindowCheck:
    """A windowed app's outputs, store and dead letters against the windows recomputed from the source."""

    closed: int
    """Windows that closed, by the recomputation."""
    emitted: int
    """Final window results in the output topic (read_committed)."""
    missing: tuple[Window, ...]
    """Closed windows never emitted."""
    repeated: tuple[Window, ...]
    """Windows emitted more than once (one entry per extra appearance)."""
    wrong: tuple[Window, ...]
    """Closed windows emitted (at least once) with a tally other than the recomputed one."""
    short: tuple[Window, ...]
    """Of those, windows emitted (at least once) with a count or total below the recomputed one: orders lost."""
    unexpected: tuple[Window, ...]
    """Windows emitted that never closed (or that no order names), or whose result is malformed."""
    kept: int
    """Windows left unexpired, by the recomputation."""
    store_missing: tuple[Window, ...]
    store_unexpected: tuple[Window, ...]
    store_wrong: tuple[Window, ...]
    store_short: tuple[Window, ...]
    """Of those, windows whose count or total is below the recomputed one."""
    stream_times_wrong: tuple[int, ...]
    """Partitions whose stored stream time is not the largest event time of their source partition."""
    late: int
    """Late orders, by the recomputation."""
    late_missing: tuple[int, ...]
    """Late orders never dead-lettered."""
    late_repeated: tuple[int, ...]
    late_unexpected: tuple[int, ...]
    """Orders dead-lettered that were not late."""
    details: tuple[str, ...] = ()
    """The first few wrong tallies, each with the recomputed one."""

    def counters(self) -> dict[str, int]:
        return {
            "windows closed (recomputed)": self.closed,
            "final windows emitted": self.emitted,
            "closed windows missing from the output": len(self.missing),
            "windows emitted more than once": len(self.repeated),
            "windows emitted with a wrong tally": len(self.wrong),
            "windows emitted with a short tally": len(self.short),
            "windows emitted that never closed": len(self.unexpected),
            "windows kept (recomputed)": self.kept,
            "kept windows missing from the store": len(self.store_missing),
            "windows in the store not kept": len(self.store_unexpected),
            "windows in the store with a wrong tally": len(self.store_wrong),
            "windows in the store with a short tally": len(self.store_short),
            "partitions with a wrong stream time": len(self.stream_times_wrong),
            "late orders (recomputed)": self.late,
            "late orders never dead-lettered": len(self.late_missing),
            "late orders dead-lettered more than once": len(self.late_repeated),
            "orders dead-lettered that were not late": len(self.late_unexpected),
        }

    def examples(self) -> list[str]:
        """The first few of each kind of mismatch, for an assertion message."""
        kinds = {
            "missing from the output": self.missing,
            "emitted more than once": self.repeated,
            "emitted with a wrong tally": self.wrong,
            "emitted with a short tally": self.short,
            "emitted, never closed": self.unexpected,
            "missing from the store": self.store_missing,
            "in the store, not kept": self.store_unexpected,
            "in the store with a wrong tally": self.store_wrong,
            "in the store with a short tally": self.store_short,
            "partitions with a wrong stream time": self.stream_times_wrong,
            "late, never dead-lettered": self.late_missing,
            "late, dead-lettered more than once": self.late_repeated,
            "dead-lettered, not late": self.late_unexpected,
        }
        found = [f"windows check: {what}: {list(windows[:8])}" for what, windows in kinds.items() if windows]
        return found + [f"windows check: {detail}" for detail in self.details]


def check_windows(spec: WorkerSpec, replayed: ReplayedWindows) -> WindowCheck:
    """Compare a windowed app's output topic (read_committed), store and dead-letter topic with `replayed`.
    Every appearance of a window in the output must carry its recomputed final tally."""
    size = spec.window_size_ms
    appearances: Counter[Window] = Counter()
    wrong: set[Window] = set()
    short: set[Window] = set()
    details: list[str] = []
    unexpected: list[Window] = []
    for message in read_committed(spec.bootstrap, spec.output, timeout=60):
        result = orjson.loads(message.value() or b"null")
        window = ((message.key() or b"").decode(), result["start"])
        appearances[window] += 1
        end = replayed.ends.get(window, result["start"] + size) if spec.session_gap_ms else result["start"] + size
        if spec.sliding_ms:
            end = result["start"] + spec.sliding_ms
        if window not in replayed.final or result["end"] != end:
            unexpected.append(window)
            continue
        tally, expected = as_tally(result["value"], spec), as_tally(replayed.final[window], spec)
        if tally != expected:
            wrong.add(window)
            if len(details) < 8:
                details.append(f"{window} emitted {tally}, recomputed {expected}")
            if falls_short(tally, expected):
                short.add(window)
    missing = tuple(sorted(set(replayed.final) - set(appearances)))
    repeated = tuple(sorted(window for window, seen in appearances.items() for _ in range(seen - 1)))
    stored, stream_times = read_windows(spec)
    stored = {w: as_tally(value, spec) for w, value in stored.items()}
    kept = {w: as_tally(tally, spec) for w, tally in replayed.kept.items()}
    store_wrong = tuple(sorted(w for w in set(stored) & set(kept) if stored[w] != kept[w]))
    details += [f"{w} stored {stored[w]}, recomputed {kept[w]}" for w in store_wrong[:8]]
    stream_times_wrong = tuple(
        sorted(p for p in range(spec.partitions) if stream_times.get(p, -1) != replayed.stream_times.get(p, -1))
    )
    dead = Counter(orjson.loads(m.value() or b"null")["id"] for m in read_committed(spec.bootstrap, dead_letters(spec)))
    return WindowCheck(
        closed=len(replayed.final),
        emitted=sum(appearances.values()),
        missing=missing,
        repeated=repeated,
        wrong=tuple(sorted(wrong)),
        short=tuple(sorted(short)),
        unexpected=tuple(unexpected),
        kept=len(replayed.kept),
        store_missing=tuple(sorted(set(replayed.kept) - set(stored))),
        store_unexpected=tuple(sorted(set(stored) - set(replayed.kept))),
        store_wrong=store_wrong,
        store_short=tuple(w for w in store_wrong if falls_short(stored[w], kept[w])),
        stream_times_wrong=stream_times_wrong,
        late=len(replayed.late_ids),
        late_missing=tuple(sorted(replayed.late_ids - set(dead))),
        late_repeated=tuple(sorted(i for i, seen in dead.items() for _ in range(seen - 1))),
        late_unexpected=tuple(sorted(set(dead) - replayed.late_ids)),
        details=tuple(details),
    )


def as_tally(value: Any, spec: WorkerSpec) -> dict:
    """A window's value (emitted, stored or recomputed) as the tally the app keeps: a columnar
    window keeps the total alone (amounts are 1 to 7: an order lost or doubled changes it)."""
    if not spec.aggregate:
        return value
    return {"total": value["total"] if isinstance(value, dict) else value}


def falls_short(tally: dict, expected: dict) -> bool:
    """Whether a window's tally counts fewer orders, or less money, than the recomputed one."""
    return any(tally[name] < expected[name] for name in expected)


def dead_letters(spec: WorkerSpec) -> str:
    """The app's dead-letter topic."""
    return build_app(spec).dead_letter_topic


# ---------------------------------------------------------------------------------------------
# Reading the result


@dataclass(frozen=True)
class StoreReading:
    """What the app's store holds per customer, read two ways (see `counting_worker`'s read mode)."""

    counts: dict[str, Tally]
    """Per customer, as point lookups find it (what processing reads), plus customers only iteration found."""
    missed_by_iteration: tuple[str, ...]
    """Customers whose state point lookups find but a full iteration of the store does not return
    (what the digests and checks read) although it ended without an error: it stopped early silently."""
    unreadable: tuple[str, ...]
    """Customers whose lookup failed (a damaged block)."""
    problems: tuple[str, ...]
    """Failures met while reading (opening, iterating, looking up, closing)."""


def read_store(spec: WorkerSpec, customers: Iterable[str], user: str | None = None) -> StoreReading:
    """Count and total per customer in the app's local store (no worker may run), read by a separate
    process (as `user` when the test runs as root) by point lookups of every given customer and by
    iterating each partition through the engine (`StorePartition.items`)."""
    command = [sys.executable, str(WORKER_SCRIPT), "--read", spec.to_json()]
    if user is not None and os.geteuid() == 0:
        command = [*as_user(user), *command]
    done = subprocess.run(
        command, input=json.dumps(sorted(customers)).encode(), capture_output=True, timeout=180, check=False
    )
    line = next((raw for raw in done.stdout.decode().splitlines() if raw.startswith("EVENT reading ")), None)
    assert line is not None, f"reading the store failed (exit {done.returncode}):\n{done.stderr.decode()[-3000:]}"
    found = json.loads(line[len("EVENT reading ") :])
    looked, iterated = found["looked"], found["iterated"]
    refused = set(found["refused"])  # the iteration raised before reaching them: a loud miss, not a silent one
    missed = tuple(sorted(c for c, kept in looked.items() if iterated.get(c) != kept and c not in refused))
    merged = {**iterated, **looked}
    counts = {customer: Tally(kept.get("count", 0), kept.get("total", 0)) for customer, kept in merged.items()}
    return StoreReading(counts, missed, tuple(found["unreadable"]), tuple(found["problems"]))


def read_counts(spec: WorkerSpec, customers: Iterable[str], user: str | None = None) -> dict[str, Tally]:
    """Count and total per customer as processing would read them (see `read_store`)."""
    return read_store(spec, customers, user).counts


@dataclass(frozen=True)
class Comparison:
    lost: int
    """Orders missing from the counts: sum over customers of max(0, expected - counted)."""
    doubled: int
    """Orders counted more than once: sum over customers of max(0, counted - expected)."""
    totals_short: tuple[str, ...]
    """Customers whose total is below the expected total (money lost, whatever the counts say)."""
    unexpected: tuple[str, ...]
    """Customers in the store that no order names."""

    @property
    def exact(self) -> bool:
        return not (self.lost or self.doubled or self.totals_short or self.unexpected)


def compare(expected: Mapping[str, Tally], stored: Mapping[str, Tally]) -> Comparison:
    nothing = Tally(0, 0)
    lost = sum(max(0, want.count - stored.get(c, nothing).count) for c, want in expected.items())
    doubled = sum(max(0, stored.get(c, nothing).count - want.count) for c, want in expected.items())
    short = tuple(sorted(c for c, want in expected.items() if stored.get(c, nothing).total < want.total))
    unexpected = tuple(sorted(set(stored) - set(expected)))
    return Comparison(lost, doubled, short, unexpected)


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int | None]:
    """The group's committed offsets, read from Kafka by a consumer that never joins the group."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False, **QUIET})
    try:
        found = reader.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in found}
    finally:
        reader.close()


def watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    """(low, high) offsets per partition."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"watermarks-{time.monotonic_ns()}", **QUIET})
    try:
        return {p: reader.get_watermark_offsets(TopicPartition(topic, p), timeout=30) for p in range(partitions)}
    finally:
        reader.close()


def group_lag(bootstrap: str, group: str, topic: str, partitions: int) -> int:
    """Messages of `topic` the group has not committed yet, by Kafka's own offsets."""
    committed = committed_offsets(bootstrap, group, topic, partitions)
    lag = 0
    for partition, (low, high) in watermarks(bootstrap, topic, partitions).items():
        done = committed[partition]
        lag += max(0, high - (low if done is None else done))
    return lag


@dataclass(frozen=True)
class Progress:
    """Everything a run can commit or write, to tell whether a failed run changed any of it."""

    committed: dict[int, int | None]
    changelog_ends: dict[int, int]
    checkpoints: dict[int, tuple[int | None, int | None]]
    """(changelog offset, source offset) of each partition's `.checkpoint` file."""


def progress_of(spec: WorkerSpec) -> Progress:
    """The group's committed offsets, the changelog's ends and the local checkpoints, as they are now."""
    app = build_app(spec)
    checkpoints: dict[int, tuple[int | None, int | None]] = {}
    for partition in range(spec.partitions):
        checkpoint = app.state.read_checkpoint(STORE, partition)
        if checkpoint is None:
            checkpoints[partition] = (None, None)
        else:
            checkpoints[partition] = (checkpoint.changelog_offset, checkpoint.source_offset)
    changelog = app.changelog_topic(STORE)
    return Progress(
        committed_offsets(spec.bootstrap, app.consumer_group, spec.source, spec.partitions),
        {p: high for p, (_, high) in watermarks(spec.bootstrap, changelog, spec.partitions).items()},
        checkpoints,
    )


def changes(before: Progress, after: Progress) -> list[str]:
    """What moved between two `Progress` readings, said plainly (empty: nothing)."""
    moved = []
    for name in ("committed", "changelog_ends", "checkpoints"):
        old, new = getattr(before, name), getattr(after, name)
        moved += [
            f"{name}[{p}]: {old.get(p)} -> {new.get(p)}"
            for p in sorted(set(old) | set(new))
            if old.get(p) != new.get(p)
        ]
    return moved


@dataclass(frozen=True)
class RunSummary:
    """One worker run of a case, as the test checks it."""

    label: str
    exit_code: int
    stop_reason: str | None
    """Why it stopped (None: killed, or failed with `error`)."""
    error: WorkerError | None
    lag: int
    """The group's lag by Kafka's committed offsets right after the run ended (-1: not measured)."""
    seconds: float
    report: dict[str, Any] | None
    log_tail: str = ""
    """What the worker's log ends with, kept when the run ended short of its goal (its limit, or an error)."""

    def describe(self) -> str:
        what = self.stop_reason or (
            f"{self.error.type}: {self.error.message}" if self.error else f"exit {self.exit_code}"
        )
        tail = f"\n    log tail:\n{self.log_tail}" if self.log_tail else ""
        return f"{self.label}: {what}, lag {self.lag}, {self.seconds:.1f} s{tail}"


GROUP_DEBUG_EVENTS = (
    "|CGRPJOINSTATE|",
    "|CGRPSTATE|",
    "|CGRPCOORD|",
    "|JOINGROUP|",
    "|SYNCGROUP|",
    "|LOST|",
    "|REJOIN|",
    "|REBALANCE|",
)
"""librdkafka's consumer-group debug lines (the fault worker enables `debug=cgrp`) that say where a
member is in joining its group and finding its coordinator."""
COUNTED_EVENTS = ("|REBOOTSTRAP|", "|FAIL|", "|CGRPQUERY|")
"""librdkafka lines too many to quote: counted, with the times of the first and last."""


def _counted(text: list[str], event: str) -> str:
    found = [line.split("|")[1] for line in text if event in line]
    return f"{event.strip('|')}: {len(found)}" + (f" ({found[0]} .. {found[-1]})" if found else "")


def diagnostic_tail(log_path: Path, lines: int = 30, group_lines: int = 25) -> str:
    """The log's last `lines` lines without librdkafka's debug lines, then its last `group_lines`
    consumer-group join lines: enough to tell why a run ended short."""
    try:
        text = log_path.read_text(errors="replace").splitlines()
    except OSError as error:
        return f"(no log: {error})"
    plain = [line for line in text if not line.startswith("%7|") and not any(event in line for event in COUNTED_EVENTS)]
    joins = [line for line in text if line.startswith("%7|") and any(event in line for event in GROUP_DEBUG_EVENTS)]
    counts = ", ".join(_counted(text, event) for event in COUNTED_EVENTS)
    quoted = [*plain[-lines:], "      ...", *joins[-group_lines:], f"librdkafka lines: {counts}"]
    return "\n".join(f"      {line[:400]}" for line in quoted)


def summarize(label: str, outcome: WorkerOutcome, spec: WorkerSpec | None = None) -> RunSummary:
    """The run's summary; with `spec`, the group's lag is read from Kafka right away."""
    lag = -1
    if spec is not None:
        lag = group_lag(spec.bootstrap, build_app(spec).consumer_group, spec.source, spec.partitions)
    stop = outcome.report["stop_reason"] if outcome.report else None
    short = outcome.error is not None or stop == "max_seconds"
    tail = diagnostic_tail(outcome.log_path) if short and outcome.log_path is not None else ""
    return RunSummary(label, outcome.exit_code, stop, outcome.error, lag, outcome.seconds, outcome.report, tail)


@dataclass
class FaultResult:
    """One fault case, as the bench prints it and the tests check it."""

    case: str
    faults: int = 0
    """Faults actually injected (kills that landed, outages, damaged stores, ...)."""
    messages: int = 0
    """Source messages the final state is checked against."""
    lost: int = -1
    doubled: int = -1
    recovery_seconds: float = 0.0
    """From the restart after the (last) fault until the worker stopped caught up."""
    totals_short: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    missed_by_iteration: tuple[str, ...] = ()
    """Customers the store's own iteration did not return although their state is there."""
    unreadable: tuple[str, ...] = ()
    runs: list[RunSummary] = field(default_factory=list)
    points: dict[str, int] = field(default_factory=dict)
    """How many kills landed where (by the worker's events)."""
    counters: dict[str, int] = field(default_factory=dict)
    """Case-specific figures (skipped messages, stores recovered, a retention gap, ...)."""
    side_routes: dict[str, Comparison] = field(default_factory=dict)
    """Other ways out of the fault that were tried, and what they left."""
    changed_by_failed_run: list[str] = field(default_factory=list)
    """What a run that stopped with an error committed or wrote anyway (must be nothing)."""
    notes: list[str] = field(default_factory=list)

    def judge(self, expected: Mapping[str, Tally], reading: StoreReading) -> FaultResult:
        """Record how the store compares with `expected` (recomputed from the source)."""
        comparison = compare(expected, reading.counts)
        self.lost, self.doubled = comparison.lost, comparison.doubled
        self.messages = sum(t.count for t in expected.values())
        self.totals_short, self.unexpected = comparison.totals_short, comparison.unexpected
        self.missed_by_iteration, self.unreadable = reading.missed_by_iteration, reading.unreadable
        self.notes += [f"reading the store: {problem}" for problem in reading.problems]
        return self

    def run(self, label: str) -> RunSummary:
        found = [run for run in self.runs if run.label == label]
        assert found, f"no run labelled {label!r} in {[run.label for run in self.runs]}"
        return found[-1]

    def count_point(self, point: str) -> None:
        self.points[point] = self.points.get(point, 0) + 1

    def describe(self) -> str:
        """Everything about the case, for an assertion message."""
        lines = [
            f"{self.case}: faults {self.faults}, messages {self.messages}, lost {self.lost}, doubled {self.doubled}, "
            f"recovery {self.recovery_seconds:.1f} s, totals short {list(self.totals_short)[:10]}, "
            f"unexpected {list(self.unexpected)[:10]}, missed by the store's iteration "
            f"{len(self.missed_by_iteration)}, unreadable {list(self.unreadable)[:10]}",
            f"kill points: {self.points}",
            f"counters: {self.counters}",
            *(
                f"side route {name}: lost {route.lost}, doubled {route.doubled}, "
                f"{len(route.totals_short)} customers with a short total"
                for name, route in self.side_routes.items()
            ),
            *(f"changed by the failed run: {change}" for change in self.changed_by_failed_run),
            *(run.describe() for run in self.runs),
            *self.notes,
        ]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# A broker of one's own, and orders that keep coming


class RestartableBroker:
    """A local broker the case may stop and start again on the same ports (clients keep their address)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self._broker = LocalKafkaBroker(home)
        self._ports: BrokerSettings | None = None

    def start(self) -> str:
        """Start it (the first time on free ports, later on the same ones); returns the bootstrap address."""
        self._broker = LocalKafkaBroker(self.home, self._ports)
        bootstrap = self._broker.start(tie_to_parent=True)
        if self._ports is None:
            state = json.loads((self.home / "broker.json").read_text())
            self._ports = BrokerSettings(
                port=int(bootstrap.rsplit(":", 1)[1]), controller_port=state["controller_port"]
            )
        return bootstrap

    def stop(self) -> None:
        self._broker.stop()


class OrderFeeder:
    """Produces orders at about `rate` per second in a thread, as live traffic would, until stopped."""

    def __init__(self, bootstrap: str, topic: str, customers: int, rate: float, batch: int = 50) -> None:
        self.bootstrap, self.topic, self.customers = bootstrap, topic, customers
        self.pause = batch / rate
        self.batch = batch
        self.produced = 0
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> OrderFeeder:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                produce_orders(self.bootstrap, self.topic, make_orders(self.batch, self.customers, start=self.produced))
                self.produced += self.batch
                self._stop.wait(self.pause)
        except BaseException as error:  # noqa: BLE001 - raised again by stop()
            self._error = error

    def stop(self) -> int:
        """Stop producing; returns how many orders were produced."""
        self._stop.set()
        self._thread.join(timeout=60)
        if self._error is not None:
            raise self._error
        return self.produced
