"""The fault suite's worker: a real worker of a counting app, run as a subprocess that reports what it does.

Owns the app every fault case runs (`count_order` keeps per customer a count of orders and their
total in the store "totals"; when the spec says `aggregate`, the columnar aggregation
`Mean("amount")` keeps them there as one aggregate, `TALLY` ([total, count], folded a consumed
batch at a time in columns, its runs observed message by message before each fold); when it says
`windowed`, a tumbling window aggregation keeps a `TALLY` per customer and window of event time
there and sends each window's final tally to the output topic once it closes (with `aggregate`
too, the columnar `Sum("amount")` of each window, folded in columns; with `regroup`, every order
goes through a repartition topic first, re-keyed by its customer field); `build_app` builds
it from a `WorkerSpec`) and this file's use as a script: `python counting_worker.py '<WorkerSpec as
JSON>'` runs one bounded worker and prints one line `EVENT <kind> <JSON>` per observable step on
stdout: `started`, `state` (each state transition), `restore_start` / `batch` / `restore_end` /
`restore_suspended` (a restore listener), `commit` (each source commit, once Kafka took it),
`progress` (every `PROGRESS_EVERY` messages), `uncommitted_applied` (a restore that applied records
of uncommitted messages, which it does only where compaction left a gap: the only way at-least-once
doubles; from the restore's log record), and at the end `report` (the worker's report) or
`error` (the error it stopped with; exit code `WORKER_FAILED`). Logs go to stderr. Armed by the
spec, the worker kills itself with SIGKILL inside its n-th commit (see `CommitPhase`): the windows
between the commit's steps are too short to hit from outside.
`faults.harness` launches it and reads the events.

`python counting_worker.py --read '<WorkerSpec as JSON>'` (customers as a JSON list on stdin) reads the
app's store instead, as the worker's user would, and prints one `EVENT reading <JSON>` line: each
customer's state by point lookups (what processing reads) and by iterating each partition through
the engine (what digests and checks read), and any failure met while reading. A separate process,
so that whatever a damaged store does to the reader (a lock left held, say) ends with it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer

from dagster_stateful.core import Aggregate, App, Mean, RestoreListener, State, Sum
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.monitoring.report import RestoreReport
from dagster_stateful.core.processing.paths.vectorized import VectorizedBatchProcessor
from dagster_stateful.core.recovery.restore_log import RESTORE_REPORT_FIELD
from dagster_stateful.core.state.keys import message_prefix, split_store_key
from dagster_stateful.errors import StatefulError

STORE = "totals"
STATE_KEYS = ("count", "total")
"""What `count_order` keeps per customer."""
TALLY = "tally"
"""The state key of an aggregating worker's {"count": ..., "total": ...} per customer."""
COMPACT_FAST = {"segment.ms": "300", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "100"}
"""Changelog compaction as aggressive as the broker allows: restores see what production sees."""
PROGRESS_EVERY = 50
"""The worker prints a progress event every this many messages it processes."""
WORKER_FAILED = 3
"""Exit code of a worker that stopped with an error (printed as an `error` event first)."""


def count_order(order: dict, state: State) -> dict:
    """Per customer: how many orders, and their total amount."""
    state.set("count", state.get("count", 0) + 1)
    state.set("total", state.get("total", 0) + order["amount"])
    return order


def tally_order(tally: dict, order: dict) -> dict:
    """An aggregating worker's `count_order`: a new tally with `order` counted."""
    return {"count": tally["count"] + 1, "total": tally["total"] + order["amount"]}


def merge_tallies(earlier: dict, later: dict) -> dict:
    """Two sessions' tallies as one (a record bridged them)."""
    return {"count": earlier["count"] + later["count"], "total": earlier["total"] + later["total"]}


def empty_tally() -> dict:
    return {"count": 0, "total": 0}


def state_of(state_key: str, value: Any) -> dict[str, int]:
    """A customer's state keys and values, as `count_order` keeps them, from one stored entry (a
    tally, or a mean's [total, count])."""
    if state_key != TALLY:
        return {state_key: value}
    return {"total": value[0], "count": value[1]} if isinstance(value, list) else dict(value)


class CommitPhase(StrEnum):
    """Where inside its n-th commit a worker kills itself (see `processing/commit/committer.py` for the order).
    Under exactly-once: before `send_offsets_to_transaction`, before `commit_transaction`, and
    after it (the RocksDB batch not written)."""

    BEFORE_DELIVERY = "before delivery"
    """Changelog records produced (some may be sent), not acknowledged; nothing committed."""
    BEFORE_OFFSETS = "delivered, offsets not committed"
    """Changelog records acknowledged; the source offsets not committed (their messages will double)."""
    AFTER_OFFSETS = "offsets committed, store not written"
    """Source offsets committed; the RocksDB batch and the checkpoint not written (the store is behind)."""


@dataclass(frozen=True)
class WorkerSpec:
    """One run of the counting app, as the subprocess builds it."""

    bootstrap: str
    source: str
    name: str
    state_dir: str
    partitions: int
    max_seconds: float = 120.0
    until_caught_up: bool = True
    commit_every: int = 200
    commit_interval: float = 0.5
    restore_batch_size: int = 100
    restore_delay: float = 0.0
    """Extra seconds each restored batch takes (a restore listener's sleep): a window to strike in."""
    step_delay: float = 0.0
    """Seconds the step sleeps every `PROGRESS_EVERY` messages (a slow step): a window to strike in."""
    hold_at: int = 0
    """The step stops at this message (0: never) until `release_file` exists, after a "holding"
    event: the worker is certainly busy processing when the harness strikes."""
    release_file: str = ""
    admin_timeout_seconds: float = 60.0
    session_timeout_ms: int = 3000
    on_error: str = "raise"
    changelog_config: Mapping[str, str] = field(default_factory=lambda: dict(COMPACT_FAST))
    kill_at_commit: int = 0
    """Kill the worker inside its n-th commit (0: never), at `kill_phase`."""
    kill_phase: str = CommitPhase.BEFORE_OFFSETS.value
    processing_guarantee: str = "at-least-once"
    transaction_timeout_ms: int = 15_000
    """Exactly-once: Kafka Streams' 10 s and a margin, rather than the engine's 60 s default: a worker
    killed inside a commit leaves its offsets unstable until its transaction times out, and the
    partitions' next owner waits that long."""
    output: str = ""
    """The topic the counted orders go to ("": none)."""
    group_instance_id: str = ""
    """Static group membership ("": none); under exactly-once it also names the transactional id."""
    num_standby_replicas: int = 0
    aggregate: bool = False
    """Keep the total and count with the columnar aggregation `Mean("amount")` instead of `count_order`
    (no output topic then: an aggregation passes on its aggregate, not the order); with `windowed`,
    each window's total with the columnar `Sum("amount")` instead of `tally_order`."""
    windowed: bool = False
    """Keep the count and total per customer and tumbling window of event time (the message
    timestamp), `tally_order` folded into `window_size_ms` windows with `window_grace_ms` of grace
    (retention: size + grace), and send each window's final tally to `output` (required) once it
    closes, as `{"start", "end", "value"}` keyed by the customer."""
    window_size_ms: int = 5_000
    window_grace_ms: int = 1_000
    session_gap_ms: int = 0
    """Windowed: sessions of `session_gap_ms` of inactivity (with `window_grace_ms` of grace) instead
    of tumbling windows, each closed session sent as `{"start", "end", "value"}` (0: tumbling)."""
    sliding_ms: int = 0
    """Windowed: sliding windows of this time difference (with `window_grace_ms` of grace) instead of
    tumbling windows, each closed window sent as `{"start", "end", "value"}` (0: tumbling)."""
    lookup_topic: str = ""
    """Join every order first (inner, on its "customer" field) with the global table of this compacted
    topic, which holds every customer: a copy of the table missing one would drop its orders, which
    the judge counts as lost ("": no join)."""
    table_topic: str = ""
    """Join every order first (inner, on its message key, the customer) with the versioned
    partitioned table of this compacted topic, co-partitioned with the source, which holds every
    customer, and keep only the orders that joined their customer's last profile: a table partition
    missing a customer or holding an older profile would drop its orders, which the judge counts as
    lost ("": no join)."""
    joined_topic: str = ""
    """Join every order (left) with the payments of this topic, co-partitioned with the source, in an
    outer interval join of `join_within_ms` either way with `window_grace_ms` of grace, kept in the
    store and sent to `output` (required): each pair merged, each record without a partner alone
    once it closed ("": no join)."""
    join_within_ms: int = 1_000
    join_tables: bool = False
    foreign_key_table: str = ""
    """Read the source as a table of orders, each naming its customer, and inner-join it on that
    field with this compacted topic's customers, kept as a global table (a foreign-key join, kept in
    the store and sent to `output`) ("": no such join)."""
    """With `joined_topic`: an outer table-table join instead (both topics read as tables, each
    update sending its key's joined latest values)."""
    regroup: bool = False
    """Re-key every order by its "customer" field first (`group_by`), through the app's repartition
    topic: the state then belongs to the repartition topic's partitions, under the same keys."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        return cls(**json.loads(text))


def joined_its_latest_profile(order: dict) -> bool:
    """Whether the order joined the tier its customer's last profile gives (`scenarios.customers_table`
    writes three rounds of profiles before any order): an order joined with another is dropped, and
    the judge counts it as lost."""
    return order.get("tier") == f"t{(int(order['customer'][1:]) + 2) % 3}"


def build_app(spec: WorkerSpec, observe: Callable[[dict], None] | None = None) -> App:
    """The counting app of `spec` (also used by the test to read its state or clear it). `observe`:
    a stateless step every order goes through (the worker's progress): after the counting, or
    before the windows of a windowed app (after them only the windows that closed flow)."""
    kafka = KafkaClients(
        {"bootstrap.servers": spec.bootstrap, "log_level": 2}, admin_timeout_seconds=spec.admin_timeout_seconds
    )
    app = App(
        name=spec.name,
        source=spec.source,
        stores=[STORE],
        state_dir=spec.state_dir,
        kafka=kafka,
        on_error=spec.on_error,
        commit_interval=spec.commit_interval,
        commit_every=spec.commit_every,
        changelog_config=spec.changelog_config,
        restore_batch_size=spec.restore_batch_size,
        processing_guarantee=spec.processing_guarantee,
        producer_config={"transaction.timeout.ms": spec.transaction_timeout_ms},
        group_instance_id=spec.group_instance_id or None,
        num_standby_replicas=spec.num_standby_replicas,
        consumer_config={
            "session.timeout.ms": spec.session_timeout_ms,
            "heartbeat.interval.ms": max(100, spec.session_timeout_ms // 6),
            "debug": "cgrp",  # the join's progress, in the log a failed case's summary quotes
        },
    )
    frame = app.dataframe()
    if spec.lookup_topic:
        frame.join(app.global_table(spec.lookup_topic, name="customers"), on="customer", on_merge="keep-left")
    if spec.table_topic:
        table = app.table(spec.table_topic, name="profiles", history=24 * 3600 * 1000)
        frame.join(table, on_merge="keep-left").filter(joined_its_latest_profile)
    if spec.regroup:
        frame.group_by("customer")
    if spec.foreign_key_table:
        if observe is not None:
            frame.update(observe)
        customers = app.global_table(spec.foreign_key_table, name="customers")
        frame.table_join(customers, on="customer", on_merge="keep-left", store=STORE)
    elif spec.joined_topic:
        if observe is not None:
            frame.update(observe)
        payments = app.stream(spec.joined_topic, name="payments")
        if spec.join_tables:
            frame.table_join(payments, how="outer", store=STORE)
        else:
            frame.join_interval(
                payments, within=spec.join_within_ms, grace=spec.window_grace_ms, how="outer", store=STORE
            )
    elif spec.windowed:
        if not spec.output:
            raise ValueError("a windowed worker sends its closed windows to an output topic")
        if observe is not None and not spec.aggregate:
            frame.update(observe)
        if spec.session_gap_ms:
            sessions = frame.session_window(spec.session_gap_ms, grace=spec.window_grace_ms)
            sessions.aggregate(Aggregate(empty_tally, tally_order, merger=merge_tallies), name=TALLY).final()
        elif spec.sliding_ms:
            sliding = frame.sliding_window(spec.sliding_ms, grace=spec.window_grace_ms)
            sliding.aggregate(Aggregate(empty_tally, tally_order), name=TALLY).final()
        else:
            windows = frame.tumbling_window(spec.window_size_ms, grace=spec.window_grace_ms)
            aggregator = Sum("amount") if spec.aggregate else Aggregate(empty_tally, tally_order)
            windows.aggregate(aggregator, name=TALLY).final()
    elif spec.aggregate:
        if spec.output:
            raise ValueError("an aggregating worker passes on tallies, not orders: it cannot fill an output topic")
        frame.aggregate(Mean("amount"), name=TALLY)
    else:
        frame.apply(count_order, stateful=True)
    if spec.output:
        app.to_topic(frame, spec.output)
    joins = spec.joined_topic or spec.foreign_key_table
    if observe is not None and not spec.windowed and not spec.aggregate and not joins:
        frame.update(observe)
    return app


# ---------------------------------------------------------------------------------------------
# The worker subprocess itself


def _emit(kind: str, data: object = None) -> None:
    sys.stdout.write(f"EVENT {kind} {json.dumps(data) if data is not None else ''}\n")
    sys.stdout.flush()


class _PrintingRestoreListener(RestoreListener):
    def __init__(self, delay: float) -> None:
        self.delay = delay

    def on_restore_start(self, partition: int, store: str, start_offset: int, end_offset: int) -> None:
        _emit("restore_start", [partition, store, start_offset, end_offset])

    def on_batch_restored(self, partition: int, store: str, batch_end_offset: int, num_restored: int) -> None:
        _emit("batch", [partition, store, batch_end_offset, num_restored])
        if self.delay:
            time.sleep(self.delay)

    def on_restore_end(self, partition: int, store: str, total_restored: int) -> None:
        _emit("restore_end", [partition, store, total_restored])

    def on_restore_suspended(self, partition: int, store: str, total_restored: int) -> None:
        _emit("restore_suspended", [partition, store, total_restored])


class _UncommittedAppliedEvents(logging.Handler):
    """Emits `uncommitted_applied` [partition, store, records] for each restore (ended or suspended)
    that applied records of uncommitted messages, from the `RestoreReport` its log record carries."""

    def emit(self, record: logging.LogRecord) -> None:
        report = getattr(record, RESTORE_REPORT_FIELD, None)
        if isinstance(report, RestoreReport) and report.records_uncommitted_applied:
            _emit("uncommitted_applied", [report.partition, report.store, report.records_uncommitted_applied])


def _install_commit_faults(spec: WorkerSpec) -> None:
    """Report every source commit, and kill this process inside the armed one (see `CommitPhase`)."""
    phase = CommitPhase(spec.kill_phase)
    commits = [0]
    offsets: list[Any] = []

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    class ObservedConsumer(Consumer):
        def commit(self, *args: Any, **kwargs: Any) -> Any:
            commits[0] += 1
            armed = commits[0] == spec.kill_at_commit
            if armed and phase is CommitPhase.BEFORE_OFFSETS:
                die()
            result = super().commit(*args, **kwargs)
            offsets = kwargs.get("offsets") or (args[0] if args else [])
            _emit("commit", {str(tp.partition): tp.offset for tp in offsets})
            if armed and phase is CommitPhase.AFTER_OFFSETS:
                die()
            return result

    def next_commit_armed_at(armed_phase: CommitPhase) -> bool:
        return bool(spec.kill_at_commit) and commits[0] + 1 == spec.kill_at_commit and phase is armed_phase

    class ObservedProducer(Producer):
        def flush(self, *args: Any, **kwargs: Any) -> int:
            if next_commit_armed_at(CommitPhase.BEFORE_DELIVERY):
                die()
            return super().flush(*args, **kwargs)

        def send_offsets_to_transaction(self, *args: Any, **kwargs: Any) -> None:
            if next_commit_armed_at(CommitPhase.BEFORE_DELIVERY):
                die()
            offsets[:] = list(args[0] if args else kwargs["positions"])
            super().send_offsets_to_transaction(*args, **kwargs)

        def commit_transaction(self, *args: Any, **kwargs: Any) -> None:
            if next_commit_armed_at(CommitPhase.BEFORE_OFFSETS):
                die()
            super().commit_transaction(*args, **kwargs)
            commits[0] += 1
            _emit("commit", {str(tp.partition): tp.offset for tp in offsets})
            if commits[0] == spec.kill_at_commit and phase is CommitPhase.AFTER_OFFSETS:
                die()

    def consumer(self: KafkaClients, config: Mapping[str, Any]) -> Consumer:
        if "partition.assignment.strategy" in config:  # the worker's group consumer, which commits
            return ObservedConsumer({**self.settings, **config})
        return Consumer({**self.settings, **config})

    def producer(self: KafkaClients, config: Mapping[str, Any] | None = None) -> Producer:
        return ObservedProducer({**self.settings, **(config or {})})

    KafkaClients.consumer = consumer  # type: ignore[method-assign]
    KafkaClients.producer = producer  # type: ignore[method-assign]


def _observe_columnar_runs(observe: Callable[[dict], None]) -> None:
    """A columnar worker has no step per message: each run it takes is observed message by message
    before it is folded (so a kill aimed at a message lands between folds or inside a commit)."""
    take_run = VectorizedBatchProcessor._process_run

    def process_run(self: VectorizedBatchProcessor, partition: int, run: list[Any]) -> int:
        for _ in run:
            observe({})
        return take_run(self, partition, run)

    VectorizedBatchProcessor._process_run = process_run  # type: ignore[method-assign]


def _wait_for_release(release: Path, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _worker_main(spec: WorkerSpec) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _install_commit_faults(spec)
    logging.getLogger("dagster_stateful").addHandler(_UncommittedAppliedEvents())
    processed = [0]

    def progress(order: dict) -> None:
        processed[0] += 1
        if processed[0] % PROGRESS_EVERY == 0:
            _emit("progress", processed[0])
            if spec.step_delay:
                time.sleep(spec.step_delay)
        if processed[0] == spec.hold_at:
            _emit("holding", processed[0])
            _wait_for_release(Path(spec.release_file))

    app = build_app(spec, observe=progress)
    if spec.aggregate:
        _observe_columnar_runs(progress)
    app.add_restore_listener(_PrintingRestoreListener(spec.restore_delay))
    app.add_state_listener(lambda new, old: _emit("state", str(new)))
    _emit("started", os.getpid())
    try:
        report = app.run_worker(max_seconds=spec.max_seconds, until_caught_up=spec.until_caught_up)
    except BaseException as error:
        logging.getLogger("counting_worker").exception("The worker stopped with an error")
        classes = tuple(cls.__name__ for cls in type(error).__mro__)
        _emit("error", {"type": type(error).__name__, "classes": classes, "message": str(error)})
        return WORKER_FAILED
    _emit(
        "report",
        {
            "stop_reason": str(report.stop_reason),
            "processed": report.total_processed,
            "committed": {str(p): o for p, o in report.committed_offsets.items()},
            "lag": report.total_lag,
            "restores": [[r.partition, str(r.kind), r.records_applied, r.completed] for r in report.restores],
            "standby_records": {str(p): records for p, records in report.standby_records.items()},
            "stores_recovered": report.stores_recovered,
            "partitions_lost": report.partitions_lost,
            "skipped": report.skipped,
            "dead_lettered": report.dead_lettered,
            "late": report.late,
            "aborted": report.transactions_aborted,
            "rebalances": report.rebalances,
            "seconds": report.seconds,
        },
    )
    return 0


def _read_main(spec: WorkerSpec, customers: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if spec.windowed:
        raise ValueError("a windowed worker's store holds windows: read it with faults.harness.read_windows")
    app = build_app(spec)
    looked: dict[str, dict[str, int]] = {}
    iterated: dict[str, dict[str, int]] = {}
    unreadable: set[str] = set()
    refused: set[str] = set()
    problems: list[str] = []
    for partition in range(spec.partitions):
        part = app.state.partition(STORE, partition)
        part.open()
        if part.recovered_from_corruption:
            problems.append(f"partition {partition} was found corrupted when opened, and moved aside")
        try:
            iteration_refused = False
            try:
                for key, value in part.items():
                    message_key, state_key = split_store_key(key)
                    state = state_of(state_key.decode(), json.loads(value))
                    iterated.setdefault(message_key.decode(), {}).update(state)
            except StatefulError as error:
                iteration_refused = True
                problems.append(f"iterating partition {partition}: {error}")
            for customer in customers:
                for name in (TALLY,) if spec.aggregate else STATE_KEYS:
                    try:
                        raw = part.get(message_prefix(customer.encode()) + name.encode())
                    except StatefulError as error:
                        unreadable.add(customer)
                        problems.append(f"reading {customer} in partition {partition}: {error}")
                        continue
                    if raw is not None:
                        looked.setdefault(customer, {}).update(state_of(name, json.loads(raw)))
                        if iteration_refused:
                            refused.add(customer)
        finally:
            try:
                part.close()
            except Exception as error:  # noqa: BLE001 - reported; this process ends right after
                problems.append(f"closing partition {partition} raised {type(error).__name__}: {error}")
    _emit(
        "reading",
        {
            "looked": looked,
            "iterated": iterated,
            "refused": sorted(refused),
            "unreadable": sorted(unreadable),
            "problems": problems[:20],
        },
    )
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--read":
        sys.exit(_read_main(WorkerSpec.from_json(sys.argv[2]), json.load(sys.stdin)))
    sys.exit(_worker_main(WorkerSpec.from_json(sys.argv[1])))
