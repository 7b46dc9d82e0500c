"""The fault cases of "Correct under every failure" and "Exactly-once processing", each run end to end
against a real broker.

Owns one function per case; each builds its topics, runs real worker subprocesses through the
fault, and returns a `FaultResult` whose lost / doubled figures compare the final store with the
counts recomputed from the source topic. tests/faults/test_faults.py runs them small and asserts;
bench/bench_faults.py runs them at scale and prints the table. The cases:

1. `sigkill_storm`: SIGKILL at random points (mid-batch, inside the commit, mid-restore), many
   times in a row, with the local state deleted before some restarts; compaction aggressive.
   Under exactly-once (case 1e) the counted orders also go to an output topic, checked order by order.
   `windowed_sigkill_storm`: the same storm on a windowed aggregation, checked window by window
   against the windows recomputed from the source.
2. `alternating_kills`: two workers of one app (separate state directories) killed in turn while
   orders keep coming: rebalances while processing.
3. `broker_outage`: the broker stopped and started on the same ports while two apps' workers run
   (one processing and patient, one restoring and impatient).
4. `corrupted_store`: an SST data block that processing reads damaged between runs;
   `shadowed_corruption`: one that newer files shadow, found only when RocksDB compacts.
5. `recreated_changelog`: the changelog deleted and created again empty.
6. `retention_cut`: the source's records deleted past the group's committed offset.
7. `read_only_state`: the state directory made read-only (the worker runs as an unprivileged user).
8. `zombie_fenced` (exactly-once): a worker frozen with SIGSTOP, its successor with the same
   `group_instance_id` fences it, and once resumed it must stop with none of its writes visible.
9. `evicted_member_fenced` (exactly-once): a worker frozen until the group evicts it; the group's
   generation fences its transaction once it resumes.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient
from support.interval_join_model import outer_join_of
from support.kafka_helpers import read_committed, wait_for

from faults.counting_worker import COMPACT_FAST, PROGRESS_EVERY, STORE, WorkerSpec, build_app
from faults.harness import (
    QUIET,
    Event,
    FaultResult,
    KillPoint,
    OrderFeeder,
    PaidOrders,
    RestartableBroker,
    TimedOrders,
    WorkerProcess,
    changes,
    check_windows,
    committed_offsets,
    compare,
    create_topic,
    expected_from_source,
    hours_ago,
    inject,
    make_orders,
    outputs_checked,
    produce_orders,
    produce_timed_orders,
    progress_of,
    read_counts,
    read_store,
    replay_session_windows,
    replay_sliding_windows,
    replay_windows,
    run_worker,
    source_messages,
    summarize,
    tally,
    uncommitted_applied_under,
    user_group,
    watermarks,
    with_kill_point,
)

UNPRIVILEGED_USER = "nobody"


@dataclass
class Lab:
    """Where a case runs: the broker, a scratch directory, and the random choices (seeded, printed)."""

    bootstrap: str
    work_dir: Path
    seed: int

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._logs = 0

    def unique(self, prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:8]}"

    def log(self, label: str) -> Path:
        self._logs += 1
        return self.work_dir / f"{self._logs:03d}-{label}.log"

    def orders_topic(self, partitions: int, orders: int, customers: int) -> str:
        source = self.unique("orders")
        create_topic(self.bootstrap, source, partitions=partitions)
        if orders:
            produce_orders(self.bootstrap, source, make_orders(orders, customers))
        return source

    def spec(self, source: str, partitions: int, **settings: Any) -> WorkerSpec:
        name = settings.pop("name", None) or self.unique("counts")
        state_dir = settings.pop("state_dir", None) or str(self.work_dir / f"state-{name}")
        return WorkerSpec(self.bootstrap, source, name, state_dir, partitions, **settings)


def finish_with(result: FaultResult, spec: WorkerSpec, lab: Lab, label: str = "final") -> FaultResult:
    """Run a worker to the end, then judge the store against the source topic read back."""
    outcome = run_worker(spec, lab.log(label))
    run = summarize(label, outcome, spec)
    result.runs.append(run)
    result.recovery_seconds = outcome.seconds
    count_uncommitted_applied(result, lab)
    return judge(result, spec)


UNCOMMITTED_APPLIED = "records of uncommitted messages applied by restores"


def count_uncommitted_applied(result: FaultResult, lab: Lab) -> None:
    """What the case's restores applied of uncommitted messages: where compaction left a gap, the only
    way an at-least-once case may double."""
    result.counters[UNCOMMITTED_APPLIED] = uncommitted_applied_under(lab.work_dir)


def judge(result: FaultResult, spec: WorkerSpec, user: str | None = None) -> FaultResult:
    """Compare the store with the counts recomputed from the source topic read back."""
    expected = expected_from_source(spec.bootstrap, spec.source)
    return result.judge(expected, read_store(spec, expected, user))


# ---------------------------------------------------------------------------------------------
# 1. SIGKILL storm


MIN_SHARE = 100
"""Fewest messages a mid-batch kill waits for."""
EXACTLY_ONCE = "exactly-once"
AT_LEAST_ONCE = "at-least-once"
KILL_SESSION_TIMEOUT_MS = 1500
"""A killed worker's partitions are handed on once its session expires: short, for many kills."""


def kill_schedule(kills: int, rng: random.Random) -> list[KillPoint]:
    """`kills` kill points, every kind about as often, in random order."""
    points = [list(KillPoint)[i % len(KillPoint)] for i in range(kills)]
    rng.shuffle(points)
    return points


def sigkill_storm(
    lab: Lab,
    orders: int = 20_000,
    customers: int = 600,
    partitions: int = 3,
    kills: int = 20,
    wipe_share: float = 0.25,
    guarantee: str = AT_LEAST_ONCE,
    aggregate: bool = False,
    regroup: bool = False,
    lookup: bool = False,
    table: bool = False,
) -> FaultResult:
    """SIGKILL one worker `kills` times at random points; before every mid-restore kill (and a
    `wipe_share` of the others) its local state is deleted first, so full restores from the
    compacted changelog happen. Orders run out before the kills do? More arrive, as in production.
    Under exactly-once the counted orders also go to an output topic, checked order by order
    (counters "outputs missing" and "outputs doubled"). `aggregate`: the worker keeps its counts
    and totals with a columnar aggregation, folded a batch at a time, and fills no output topic.
    `regroup`: every order goes through the app's repartition topic first (`group_by`). `lookup`:
    before that, every order is joined with a global table of all customers (`customers_table`).
    `table`: every order is joined with a partitioned, versioned table of all customers instead."""
    exactly_once = guarantee == EXACTLY_ONCE
    label = "1 SIGKILL at random points" + (" (exactly-once)" if exactly_once else "")
    result = FaultResult(label + (", re-keyed through a repartition topic" if regroup else ""))
    # A versioned table joins each order as of its timestamp: its profiles come first.
    table_topic = customers_table(lab, customers, partitions) if table else ""
    source = lab.orders_topic(partitions, orders, customers)
    produced = orders
    output = lab.unique("counted") if exactly_once and not aggregate else ""
    if output:
        create_topic(lab.bootstrap, output, partitions)
    spec = lab.spec(
        source,
        partitions,
        step_delay=0.01,
        restore_delay=0.03,
        session_timeout_ms=KILL_SESSION_TIMEOUT_MS,
        processing_guarantee=guarantee,
        output=output,
        aggregate=aggregate,
        regroup=regroup,
        lookup_topic=customers_table(lab, customers) if lookup else "",
        table_topic=table_topic,
    )

    def more_orders(count: int) -> None:
        nonlocal produced
        produce_orders(lab.bootstrap, source, make_orders(count, customers, start=produced))
        produced += count

    changelog = storm(lab, result, spec, kills, max(MIN_SHARE, orders // (kills + 2)), wipe_share, more_orders)
    finish_with(result, spec, lab)
    result.counters["changelog records compacted away"] = compacted_away(lab.bootstrap, changelog, partitions)
    if output:
        count_outputs(result, spec)
    return result


def customers_table(lab: Lab, customers: int, partitions: int = 2) -> str:
    """A compacted topic (compacted as fast as Kafka allows) holding a profile for every customer,
    rewritten three times over so that compaction has records to remove."""
    topic = lab.unique("customers")
    create_topic(lab.bootstrap, topic, partitions, {**COMPACT_FAST, "cleanup.policy": "compact"})
    profiles = [
        (f"c{c}".encode(), orjson.dumps({"tier": f"t{(c + round_) % 3}"}))
        for round_ in range(3)
        for c in range(customers)
    ]
    produce_orders(lab.bootstrap, topic, profiles)
    return topic


def storm(
    lab: Lab,
    result: FaultResult,
    spec: WorkerSpec,
    kills: int,
    share: int,
    wipe_share: float,
    more_orders: Callable[[int], None],
) -> str:
    """The storm of `sigkill_storm` (and `windowed_sigkill_storm`): run a worker of `spec` again and
    again until `kills` kills landed, at the points of `kill_schedule`, a mid-batch kill after about
    `share` messages of the run. Before every mid-restore kill (and a `wipe_share` of the others,
    once the changelog holds something) the local state is deleted. A worker that catches up before
    its kill is not killed: `more_orders(2 * share)` then produces more. Records the kills, where
    they landed and the restores in `result`; returns the store's changelog topic."""
    app = build_app(spec)
    schedule = kill_schedule(kills, lab.rng)
    counters = {"state deleted before a restart": 0, "restores begun": 0, "full restores begun": 0}
    app.provision()  # the changelog exists from the start: it is read before every run
    changelog = app.changelog_topic(STORE)
    for _ in range(3 * kills):
        if not schedule:
            break
        point = schedule[0]
        # Deleting the state before anything was committed to the changelog leaves nothing to restore.
        committed_state = any(high for _, high in watermarks(lab.bootstrap, changelog, spec.partitions).values())
        if point is KillPoint.MID_RESTORE and not committed_state and set(schedule) != {point}:
            schedule.append(schedule.pop(0))  # a restore to kill needs a changelog: this kill comes later
            continue
        wiped = committed_state and (point is KillPoint.MID_RESTORE or lab.rng.random() < wipe_share)
        if wiped:
            app.clear_state()
            counters["state deleted before a restart"] += 1
        with WorkerProcess(with_kill_point(spec, point, lab.rng), lab.log("storm")) as worker:
            injection = inject(worker, point, lab.rng, messages=lab.rng.randint(share // 2, share * 3 // 2))
        counters["restores begun"] += injection.restores_begun
        counters["full restores begun"] += injection.restores_begun if wiped else 0
        if injection.killed:
            schedule.pop(0)
            result.faults += 1
            result.count_point(f"{point.value} (seen: {injection.seen.split(' (')[0]})")
        else:
            result.runs.append(summarize("caught up before its kill", injection.outcome))
            more_orders(share * 2)
    result.counters.update(counters)
    return changelog


WINDOW_SIZE_MS = 5_000
WINDOW_GRACE_MS = 1_000


COLUMNAR_WORKER_LOG = "a batch at a time, in columns"
"""What a worker logs when it starts on the columnar path (`batch_path.choose_path`)."""


def windowed_sigkill_storm(
    lab: Lab,
    orders: int = 4_000,
    customers: int = 24,
    partitions: int = 3,
    kills: int = 10,
    wipe_share: float = 0.25,
    guarantee: str = EXACTLY_ONCE,
    columnar: bool = False,
    session_gap_ms: int = 0,
    sliding_ms: int = 0,
) -> FaultResult:
    """`sigkill_storm` for a windowed aggregation: the worker folds each order into its customer's
    tumbling window of event time (the message timestamp; windows of `WINDOW_SIZE_MS` with
    `WINDOW_GRACE_MS` of grace, deleted as they close) and sends each window's final tally to an
    output topic once it closes; late orders are dead-lettered. Orders carry event times 20-50 ms
    apart from three hours ago on, one in ten lagging up to three graces behind (`TimedOrders`), so
    windows close all through the storm. Judged against the windows recomputed from the source
    topic (`replay_windows`, `check_windows`, recorded in counters): under exactly-once every closed
    window appears in the output (read_committed) exactly once with its recomputed tally, no other
    window does, every late order is dead-lettered exactly once, and the store holds exactly the
    unexpired windows with their tallies; under at-least-once each appears at least once, and no
    tally falls short (redone work may count orders twice). Either way the store holds exactly the
    unexpired windows, and each partition's stream time. `lost` and `doubled` count windows here:
    closed windows missing from the output, and extra appearances. `columnar`: each window keeps the
    columnar `Sum("amount")` (folded a consumed batch at a time in columns), judged by its total.
    `session_gap_ms`: sessions of that inactivity gap (with the same grace) instead of tumbling
    windows, judged against `replay_session_windows`; `sliding_ms`: sliding windows of that time
    difference (with the same grace), judged against `replay_sliding_windows`."""
    exactly_once = guarantee == EXACTLY_ONCE
    name = "1w SIGKILL at random points, " + ("sessions" if session_gap_ms else "sliding" if sliding_ms else "windowed")
    name += " in columns" if columnar else ""
    result = FaultResult(name + (" (exactly-once)" if exactly_once else ""))
    timed = TimedOrders(customers, random.Random(lab.seed), start_ms=hours_ago(3), max_lag_ms=3 * WINDOW_GRACE_MS)
    source = lab.unique("orders")
    create_topic(lab.bootstrap, source, partitions)
    produce_timed_orders(lab.bootstrap, source, timed.next(orders))
    output = lab.unique("windows")
    create_topic(lab.bootstrap, output, partitions)
    spec = lab.spec(
        source,
        partitions,
        step_delay=0.01,
        restore_delay=0.03,
        restore_batch_size=20,  # a restore of the few live windows still takes several batches to strike in
        session_timeout_ms=KILL_SESSION_TIMEOUT_MS,
        processing_guarantee=guarantee,
        output=output,
        on_error="dead-letter",
        windowed=True,
        aggregate=columnar,
        window_size_ms=WINDOW_SIZE_MS,
        window_grace_ms=WINDOW_GRACE_MS,
        session_gap_ms=session_gap_ms,
        sliding_ms=sliding_ms,
    )

    def more_orders(count: int) -> None:
        produce_timed_orders(lab.bootstrap, source, timed.next(count))

    changelog = storm(lab, result, spec, kills, max(MIN_SHARE, orders // (kills + 2)), wipe_share, more_orders)
    outcome = run_worker(spec, lab.log("final"))
    result.runs.append(summarize("final", outcome, spec))
    result.recovery_seconds = outcome.seconds
    result.counters["changelog records compacted away"] = compacted_away(lab.bootstrap, changelog, partitions)
    count_uncommitted_applied(result, lab)
    messages = source_messages(lab.bootstrap, source)
    result.messages = len(messages)
    if session_gap_ms:
        replayed = replay_session_windows(messages, session_gap_ms, WINDOW_GRACE_MS)
    elif sliding_ms:
        replayed = replay_sliding_windows(messages, sliding_ms, WINDOW_GRACE_MS)
    else:
        replayed = replay_windows(messages, WINDOW_SIZE_MS, WINDOW_GRACE_MS)
    check = check_windows(spec, replayed)
    result.counters.update(check.counters())
    result.counters["worker runs folding in columns"] = sum(
        COLUMNAR_WORKER_LOG in log.read_text(errors="replace") for log in lab.work_dir.glob("*.log")
    )
    # State, as for the other storms: windows missing or short are lost orders, windows too high are
    # doubled ones. Outputs sent again by redone work are counted apart ("windows emitted more than once").
    short = set(check.short) | set(check.store_short)
    result.lost = len(check.missing) + len(short)
    result.doubled = len((set(check.wrong) | set(check.store_wrong)) - short)
    result.notes += check.examples()
    return result


JOIN_WITHIN_MS = 1_000
JOIN_MISMATCHES = ("join results missing", "join results never due", "join results doubled")
"""What `joined_sigkill_storm` finds against the join recomputed from both topics: all 0 under
exactly-once; under at-least-once only results sent again ("doubled") are allowed."""


def joined_sigkill_storm(
    lab: Lab,
    orders: int = 3_000,
    customers: int = 24,
    partitions: int = 3,
    kills: int = 10,
    wipe_share: float = 0.25,
    guarantee: str = EXACTLY_ONCE,
    tables: bool = False,
) -> FaultResult:
    """`sigkill_storm` for an outer interval join: orders (keyed by customer, 20-50 ms apart from
    three hours ago on) joined with their customers' payments (a second topic, co-partitioned, up
    to 1.5 s after their order: some past the join's second) within `JOIN_WITHIN_MS` either way,
    with `WINDOW_GRACE_MS` of grace, both sides kept in the store and its changelog. More orders and
    payments arrive between runs a slice of event time at a time (`PaidOrders`), so records close
    all through the storm. Judged against the join recomputed from the two topics alone
    (`outer_join_of`, counters `JOIN_MISMATCHES`): every pair in reach, and every record without a
    partner once stream time passed its reach and grace, sent (read_committed) exactly once under
    exactly-once, at least once under at-least-once; nothing else sent, so a record sent alone
    before its partner came is "never due". `tables`: an outer table-table join of the two topics
    instead, judged by the output's last value of each key against the join of the two topics'
    last values (`join_tables_judged`)."""
    exactly_once = guarantee == EXACTLY_ONCE
    kind = "table join" if tables else "interval join"
    result = FaultResult(f"1j SIGKILL at random points, {kind}" + (" (exactly-once)" if exactly_once else ""))
    paid = PaidOrders(customers, random.Random(lab.seed), start_ms=hours_ago(3))
    source, payments, output = lab.unique("orders"), lab.unique("payments"), lab.unique("joined")
    for topic in (source, payments, output):
        create_topic(lab.bootstrap, topic, partitions)

    def more_orders(count: int) -> None:
        new_orders, new_payments = paid.next(count)
        produce_timed_orders(lab.bootstrap, source, new_orders)
        produce_timed_orders(lab.bootstrap, payments, new_payments)

    more_orders(orders)
    spec = lab.spec(
        source,
        partitions,
        step_delay=0.01,
        restore_delay=0.03,
        restore_batch_size=20,
        session_timeout_ms=KILL_SESSION_TIMEOUT_MS,
        processing_guarantee=guarantee,
        output=output,
        on_error="dead-letter",
        joined_topic=payments,
        join_tables=tables,
        join_within_ms=JOIN_WITHIN_MS,
        window_grace_ms=WINDOW_GRACE_MS,
    )
    changelog = storm(lab, result, spec, kills, max(MIN_SHARE, orders // (kills + 2)), wipe_share, more_orders)
    outcome = run_worker(spec, lab.log("final"))
    result.runs.append(summarize("final", outcome, spec))
    result.recovery_seconds = outcome.seconds
    result.counters["changelog records compacted away"] = compacted_away(lab.bootstrap, changelog, partitions)
    count_uncommitted_applied(result, lab)
    if tables:
        return join_tables_judged(result, lab.bootstrap, source, payments, output)
    expected = recomputed_join(lab.bootstrap, source, payments)
    sent: Counter[tuple[str, Any, Any]] = Counter()
    for message in read_committed(lab.bootstrap, output):
        value = orjson.loads(message.value() or b"null")
        sent[(message.key().decode(), value.get("id"), value.get("payment"))] += 1
    result.messages = sum(expected.values())
    result.counters["join pairs (recomputed)"] = sum(
        1 for _, left, right in expected if left is not None and right is not None
    )
    result.counters["join results sent alone (recomputed)"] = len(expected) - result.counters["join pairs (recomputed)"]
    result.counters["join results missing"] = len(set(expected) - set(sent))
    result.counters["join results never due"] = len(set(sent) - set(expected))
    result.counters["join results doubled"] = sum(count - 1 for count in sent.values())
    result.lost = result.counters["join results missing"]
    result.doubled = result.counters["join results doubled"]
    result.notes += [
        f"missing: {sorted(set(expected) - set(sent), key=repr)[:5]}",
        f"never due: {sorted(set(sent) - set(expected), key=repr)[:5]}",
    ]
    return result


def join_tables_judged(result: FaultResult, bootstrap: str, orders: str, payments: str, output: str) -> FaultResult:
    """The table join's output against the two topics read as tables: each key's last output value
    is the outer join of its last order and last payment (counters `JOIN_MISMATCHES`: "missing" a
    key whose last value differs or is absent, "never due" a key output that neither table has)."""
    latest: list[dict[str, Any]] = [{}, {}]
    for index, topic in enumerate((orders, payments)):
        for message in source_messages(bootstrap, topic):
            latest[index][(message.key() or b"").decode()] = orjson.loads(message.value() or b"null")
    expected = {key: {**latest[1].get(key, {}), **latest[0].get(key, {})} for key in set(latest[0]) | set(latest[1])}
    sent: dict[str, Any] = {}
    counts: Counter[str] = Counter()
    for message in read_committed(bootstrap, output):
        key = (message.key() or b"").decode()
        sent[key] = orjson.loads(message.value() or b"null")
        counts[key] += 1
    result.messages = sum(counts.values())
    result.counters["join pairs (recomputed)"] = sum(1 for key in expected if key in latest[0] and key in latest[1])
    result.counters["join results sent alone (recomputed)"] = len(expected) - result.counters["join pairs (recomputed)"]
    result.counters["join results missing"] = sum(1 for key, value in expected.items() if sent.get(key) != value)
    result.counters["join results never due"] = len(set(sent) - set(expected))
    result.counters["join results doubled"] = 0  # an update sent again is no error in a table's output
    result.lost = result.counters["join results missing"]
    result.doubled = 0
    wrong = sorted(key for key, value in expected.items() if sent.get(key) != value)[:5]
    result.notes += [f"keys whose last output is not the join of the last values: {wrong}"]
    return result


def foreign_key_sigkill_storm(
    lab: Lab, updates: int = 2_000, partitions: int = 3, kills: int = 10, guarantee: str = EXACTLY_ONCE
) -> FaultResult:
    """`sigkill_storm` for a foreign-key join: orders read as a table (300 keys, each update naming
    one of 30 customers, a tenth of them deletes) inner-joined on their customer with a global table
    of customers (a compacted topic of 2 partitions, so not co-partitioned; a tenth of its updates
    deletes), both compacted aggressively and updated between runs. Judged by the output's last
    value of each order against its last value merged with its customer's last value
    (`foreign_key_judged`)."""
    exactly_once = guarantee == EXACTLY_ONCE
    result = FaultResult("1k SIGKILL at random points, foreign-key join" + (" (exactly-once)" if exactly_once else ""))
    rng = random.Random(lab.seed)
    source, customers, output = lab.unique("orders"), lab.unique("customers"), lab.unique("joined")
    create_topic(lab.bootstrap, source, partitions, {"cleanup.policy": "compact", **COMPACT_FAST})
    create_topic(lab.bootstrap, customers, 2, {"cleanup.policy": "compact", **COMPACT_FAST})
    create_topic(lab.bootstrap, output, partitions)
    produced = [0]

    def more_orders(count: int) -> None:
        start = produced[0]
        produced[0] += count
        orders, tiers = [], []
        for i in range(start, start + count):
            customer = f"c{rng.randrange(30)}"
            value = None if rng.random() < 0.1 else orjson.dumps({"id": i, "customer": customer})
            orders.append((f"o{rng.randrange(300)}".encode(), value, 0))
            if i % 5 == 0:
                tier = None if rng.random() < 0.1 else orjson.dumps({"tier": i, "cid": customer})
                tiers.append((customer.encode(), tier, 0))
        produce_timed_orders(lab.bootstrap, customers, tiers)  # type: ignore[arg-type]  # None: a delete
        produce_timed_orders(lab.bootstrap, source, orders)  # type: ignore[arg-type]

    more_orders(updates)
    spec = lab.spec(
        source,
        partitions,
        step_delay=0.01,
        restore_delay=0.03,
        restore_batch_size=20,
        session_timeout_ms=KILL_SESSION_TIMEOUT_MS,
        processing_guarantee=guarantee,
        output=output,
        on_error="dead-letter",
        foreign_key_table=customers,
    )
    storm(lab, result, spec, kills, max(MIN_SHARE, updates // (kills + 2)), 0.25, more_orders)
    outcome = run_worker(spec, lab.log("final"))
    result.runs.append(summarize("final", outcome, spec))
    result.recovery_seconds = outcome.seconds
    count_uncommitted_applied(result, lab)
    return foreign_key_judged(result, lab.bootstrap, source, customers, output)


def foreign_key_judged(result: FaultResult, bootstrap: str, orders: str, customers: str, output: str) -> FaultResult:
    """The foreign-key join's output against the two topics read as tables (counters
    `JOIN_MISMATCHES`: "missing" an order whose last output differs from its last value merged with
    its customer's, "never due" an order output that the inner join does not hold)."""
    latest: list[dict[str, Any]] = [{}, {}]
    for index, topic in enumerate((orders, customers)):
        for message in source_messages(bootstrap, topic):
            raw = message.value()
            latest[index][(message.key() or b"").decode()] = None if raw is None else orjson.loads(raw)
    expected = {}
    for key, order in latest[0].items():
        customer = None if order is None else latest[1].get(order["customer"])
        if order is not None and customer is not None:
            expected[key] = {**customer, **order}
    sent: dict[str, Any] = {}
    for message in read_committed(bootstrap, output):
        raw = message.value()
        sent[(message.key() or b"").decode()] = None if raw is None else orjson.loads(raw)
    held = {key: value for key, value in sent.items() if value is not None}
    result.messages = len(sent)
    result.counters["join pairs (recomputed)"] = len(expected)
    result.counters["join results sent alone (recomputed)"] = 0
    result.counters["join results missing"] = sum(1 for key, value in expected.items() if held.get(key) != value)
    result.counters["join results never due"] = len(set(held) - set(expected))
    result.counters["join results doubled"] = 0  # an update sent again is no error in a table's output
    result.lost = result.counters["join results missing"]
    wrong = [(key, held.get(key), expected[key]) for key in sorted(expected) if held.get(key) != expected[key]]
    result.notes += [
        f"orders whose last output is not the join of the last values (sent, expected): {wrong[:5]}",
        f"orders sent that the join does not hold: {sorted(set(held) - set(expected))[:5]}",
    ]
    return result


def recomputed_join(bootstrap: str, orders: str, payments: str) -> Counter[tuple[str, Any, Any]]:
    """The storm's outer join recomputed from the two topics as Kafka has them, partition by partition."""
    sides: dict[int, tuple[list, list]] = {}
    for index, topic in enumerate((orders, payments)):
        for message in source_messages(bootstrap, topic):
            key, partition, value = (
                message.key() or b"",
                message.partition() or 0,
                orjson.loads(message.value() or b"null"),
            )
            record = (key.decode(), message.timestamp()[1], value["id" if index == 0 else "payment"])
            sides.setdefault(partition, ([], []))[index].append(record)
    expected: Counter[tuple[str, Any, Any]] = Counter()
    for lefts, rights in sides.values():
        expected += outer_join_of(lefts, rights, JOIN_WITHIN_MS, JOIN_WITHIN_MS, WINDOW_GRACE_MS)
    return expected


def exactly_once_spec(lab: Lab, orders: int, customers: int, partitions: int, **settings: Any) -> WorkerSpec:
    """The spec of an exactly-once case: its source filled with orders, an output topic, slow steps."""
    source = lab.orders_topic(partitions, orders, customers)
    output = lab.unique("counted")
    create_topic(lab.bootstrap, output, partitions)
    return lab.spec(
        source,
        partitions,
        step_delay=0.05,
        session_timeout_ms=KILL_SESSION_TIMEOUT_MS,
        processing_guarantee=EXACTLY_ONCE,
        output=output,
        **settings,
    )


def count_outputs(result: FaultResult, spec: WorkerSpec) -> None:
    """Record the orders missing from, and repeated in, the case's output topic."""
    missing, extra = outputs_checked(spec.bootstrap, spec.source, spec.output)
    result.counters.update({"outputs missing": missing, "outputs doubled": extra})


def evicted_member_fenced(lab: Lab, orders: int = 3_000, customers: int = 200, partitions: int = 2) -> FaultResult:
    """Exactly-once, dynamic membership: worker A is frozen with SIGSTOP mid-work until the group
    evicts it (session timeout); worker B (its own state directory and transactional id) takes every
    partition and processes everything. Then A is resumed with its open transaction: the group's
    generation must fence it (its offsets refused, its transaction aborted). A fresh worker C then
    restores every store from the changelogs alone, so the judged state is exactly what the
    transactions committed."""
    result = FaultResult("9 evicted member fenced by the group (exactly-once)")
    base = exactly_once_spec(lab, orders, customers, partitions)
    with WorkerProcess(replace(base, state_dir=f"{base.state_dir}-A"), lab.log("evicted")) as worker_a:
        # 250 messages: inside the step's sleep between two commits (every 200), so a transaction is open
        worker_a.wait_for(lambda _: worker_a.processed() >= 5 * PROGRESS_EVERY, 120, "worker A to process")
        worker_a.pause()
        result.faults += 1
        successor = run_worker(replace(base, state_dir=f"{base.state_dir}-B"), lab.log("successor"))
        result.runs.append(summarize("successor", successor, base))
        worker_a.resume()
        evicted = worker_a.finish(120)
    result.runs.append(summarize("evicted", evicted))
    result.counters["evicted worker's transactions aborted"] = (evicted.report or {}).get("aborted", -1)
    finish_with(result, replace(base, state_dir=f"{base.state_dir}-C"), lab, "restored from the changelogs")
    count_outputs(result, base)
    return result


def zombie_fenced(lab: Lab, orders: int = 3_000, customers: int = 200, partitions: int = 2) -> FaultResult:
    """Exactly-once: worker A (static member "w1") is frozen with SIGSTOP mid-work, an open
    transaction in hand; worker B, started with the same group_instance_id (so the same
    transactional id) on another state directory, fences it and processes everything. Then A is
    resumed: it must stop with an error and none of its writes may ever appear."""
    result = FaultResult("8 zombie worker fenced (exactly-once)")
    base = exactly_once_spec(lab, orders, customers, partitions, group_instance_id="w1")
    zombie = replace(base, state_dir=f"{base.state_dir}-A")
    with WorkerProcess(zombie, lab.log("zombie")) as worker_a:
        worker_a.wait_for(lambda _: worker_a.processed() >= 4 * PROGRESS_EVERY, 120, "the zombie to process")
        worker_a.pause()
        result.faults += 1
        result.counters["processed by A before its pause"] = worker_a.processed()
        successor = run_worker(replace(base, state_dir=f"{base.state_dir}-B"), lab.log("successor"))
        settled = summarize("successor", successor, base)
        worker_a.resume()
        zombie_outcome = worker_a.finish(120)
    result.runs += [summarize("zombie", zombie_outcome), settled]  # the successor's run settled the case
    result.recovery_seconds = successor.seconds
    result.counters["zombie exit code"] = zombie_outcome.exit_code
    if zombie_outcome.error is not None:
        result.notes.append(f"the zombie stopped with {zombie_outcome.error.type}: {zombie_outcome.error.message}")
    judge(result, replace(base, state_dir=f"{base.state_dir}-B"))
    count_outputs(result, base)
    return result


def compacted_away(bootstrap: str, topic: str, partitions: int) -> int:
    """Offsets of `topic` no record sits on any more: what the log cleaner removed."""
    marks = watermarks(bootstrap, topic, partitions)
    return sum(high - low for low, high in marks.values()) - len(source_messages(bootstrap, topic))


# ---------------------------------------------------------------------------------------------
# 2. Two workers killed in turn


def alternating_kills(
    lab: Lab,
    kills: int = 6,
    customers: int = 400,
    partitions: int = 4,
    rate: float = 400.0,
    guarantee: str = AT_LEAST_ONCE,
) -> FaultResult:
    """Workers A and B of one app (one consumer group, separate state directories) run while orders
    keep coming; A and B are SIGKILLed in turn (each once both process, after 100-400 more messages
    and a random delay). The survivor takes the dead one's partitions (restoring them into its own
    state directory) and, once it processes them, the dead one is restarted and takes some back:
    restores and rebalances while processing. Then both stop (SIGTERM) and A runs until caught up."""
    result = FaultResult("2 two workers killed in turn" + (" (exactly-once)" if guarantee == EXACTLY_ONCE else ""))
    source = lab.orders_topic(partitions, 0, customers)
    base = lab.spec(
        source,
        partitions,
        step_delay=0.05,
        until_caught_up=False,
        max_seconds=600,
        session_timeout_ms=KILL_SESSION_TIMEOUT_MS,
        processing_guarantee=guarantee,
    )
    specs = {
        "A": replace(base, state_dir=str(lab.work_dir / f"{base.name}-A")),
        "B": replace(base, state_dir=str(lab.work_dir / f"{base.name}-B")),
    }
    feeder = OrderFeeder(lab.bootstrap, source, customers, rate).start()
    workers = {label: WorkerProcess(spec, lab.log(f"worker-{label}")) for label, spec in specs.items()}
    try:
        for turn in range(kills):
            label, other = "AB"[turn % 2], "BA"[turn % 2]
            wait_until_processing(workers[other], f"worker {other}")  # both hold partitions and process
            worker, survivor = workers[label], workers[other]
            more = worker.processed() + lab.rng.randint(100, 400)
            seen_before = len(survivor.events)
            injection = inject(worker, KillPoint.MID_BATCH, lab.rng, messages=more, timeout=120)
            assert injection.killed, f"worker {label} ended by itself: {summarize(label, injection.outcome).describe()}"
            result.faults += 1
            result.count_point(f"{label} {injection.seen.split(' (')[0]}")
            wait_for_takeover(survivor, seen_before, f"worker {other} to take over {label}'s partitions")
            workers[label] = WorkerProcess(specs[label], lab.log(f"worker-{label}"))
        # Both back at work and done rebalancing (a cooperative rebalance takes two rounds), then stopped.
        while not all(processing_since_running(worker) for worker in workers.values()):
            for label, worker in workers.items():
                if not worker.wait_for(settled_check(worker), 120, f"worker {label} to settle"):
                    raise AssertionError(f"worker {label} exited before it settled:\n{worker.log_tail()}")
    finally:
        produced = feeder.stop()
        for worker in workers.values():
            worker.terminate()
    for label, worker in workers.items():
        result.runs.append(summarize(f"{label} stopped by SIGTERM", worker.finish(120)))
        result.notes.append(f"{label}'s state listener last said {last_state_before_stopping(worker)} while processing")
    result.counters["workers processing while their state said REBALANCING"] = sum(
        last_state_before_stopping(worker) != "RUNNING" for worker in workers.values()
    )
    result.counters["orders produced while killing"] = produced
    last_survivor = "AB"[kills % 2]  # the one not killed last: it took the other's partitions and gave some back
    report = result.run(f"{last_survivor} stopped by SIGTERM").report or {}
    result.counters["rebalances seen by the survivor of the last kill"] = int(report.get("rebalances", 0))
    final = replace(specs["A"], until_caught_up=True, step_delay=0.0)
    finish_with(result, final, lab)
    changelog = build_app(final).changelog_topic(STORE)
    result.counters["changelog records compacted away"] = compacted_away(lab.bootstrap, changelog, partitions)
    return result


def wait_for_takeover(worker: WorkerProcess, since: int, what: str) -> None:
    """Until `worker` has taken new partitions and processes them all (its state became RUNNING after
    its `since`-th event: a partition it takes is restored first, and the state says RUNNING once no
    restore is left)."""

    def running_again(events: list[Event]) -> bool:
        return any(e.kind == "state" and e.data == "RUNNING" for e in events[since:])

    assert worker.wait_for(running_again, 120, what), f"the worker ended instead:\n{worker.log_tail()}"


def last_state_before_stopping(worker: WorkerProcess) -> str | None:
    """The state the worker's state listener last reported before its shutdown began."""
    states = [e.data for e in worker.events if e.kind == "state"]
    if "PENDING_SHUTDOWN" in states:
        states = states[: states.index("PENDING_SHUTDOWN")]
    return states[-1] if states else None


def processing_since_running(worker: WorkerProcess) -> bool:
    """Whether the worker's state listener last said RUNNING and it has processed since."""
    last_state = max((i for i, e in enumerate(worker.events) if e.kind == "state"), default=None)
    if last_state is None or worker.events[last_state].data != "RUNNING":
        return False
    return any(e.kind == "progress" for e in worker.events[last_state + 1 :])


def settled_check(worker: WorkerProcess) -> Callable[[list[Event]], bool]:
    return lambda _: processing_since_running(worker)


def wait_until_processing(worker: WorkerProcess, what: str) -> None:
    worker.wait_for(lambda _: worker.processed() > 0, 120, f"{what} to process messages")


def wait_until_processed(worker: WorkerProcess, messages: int) -> None:
    """Until the worker has committed once and processed `messages` (it must not end first)."""
    reached = worker.wait_for(
        lambda events: any(e.kind == "commit" for e in events) and worker.processed() >= messages,
        120,
        f"the worker to commit and process {messages} messages",
    )
    assert reached, f"the worker ended before processing {messages} messages:\n{worker.log_tail()}"


# ---------------------------------------------------------------------------------------------
# 3. Broker outage


PATIENT_TIMEOUT = 120.0


def broker_outage(
    lab: Lab,
    broker: RestartableBroker,
    orders: int = 5000,
    customers: int = 300,
    partitions: int = 3,
    outage_seconds: float = 0.0,
    impatient_timeout: float = 3.0,
    guarantee: str = AT_LEAST_ONCE,
) -> list[FaultResult]:
    """Stop the broker (the case's own, at `lab.bootstrap`) while two apps' workers run, and start it
    again on the same ports after at least `outage_seconds` (its restart alone takes several seconds,
    longer than the 3 s session timeout: the group loses its members).

    The patient worker (admin timeout 120 s) is processing when the broker stops: it must wait, get
    its partitions back and finish caught up. The impatient one (admin timeout `impatient_timeout`)
    is restoring its deleted state from the changelog: it may wait too or stop with a clear error. A
    second impatient worker, started while the broker is down, must stop with a clear error once its
    admin timeout has passed. After each, a run (the next one, where the worker stopped) completes
    without loss. Returns the patient app's result, then the impatient app's."""
    suffix = " (exactly-once)" if guarantee == EXACTLY_ONCE else ""
    patient = FaultResult(f"3 broker outage (patient worker, processing){suffix}")
    impatient = FaultResult(f"3 broker outage (impatient worker, restoring){suffix}")
    busy_from = min(300, orders // 10)
    release = lab.work_dir / f"release-patient-{uuid.uuid4().hex[:8]}"
    patient_spec = lab.spec(
        lab.orders_topic(partitions, orders, customers),
        partitions,
        step_delay=0.05,
        release_file=str(release),
        admin_timeout_seconds=PATIENT_TIMEOUT,
        session_timeout_ms=3000,
        processing_guarantee=guarantee,
    )
    # Held only after its first commit (at most `commit_every` messages in), which the outage waits for.
    patient_spec = replace(patient_spec, hold_at=max(busy_from, patient_spec.commit_every) + PROGRESS_EVERY)
    impatient_spec = lab.spec(
        lab.orders_topic(partitions, orders // 2, customers=orders),  # a key per order: a long restore
        partitions,
        restore_delay=0.1,
        admin_timeout_seconds=impatient_timeout,
        session_timeout_ms=3000,
        processing_guarantee=guarantee,
    )
    impatient.runs.append(summarize("before", run_worker(impatient_spec, lab.log("before")), impatient_spec))
    build_app(impatient_spec).clear_state()
    with ExitStack() as running:
        processing = running.enter_context(WorkerProcess(patient_spec, lab.log("patient-through-the-outage")))
        wait_until_processed(processing, busy_from)
        restoring = running.enter_context(WorkerProcess(impatient_spec, lab.log("impatient-through-the-outage")))
        restoring.wait_for(
            lambda events: sum(1 for e in events if e.kind == "batch") >= 2, 120, "the impatient worker to restore"
        )
        assert restoring.restoring(), f"the restore ended too soon for the outage:\n{restoring.log_tail()}"
        assert processing.alive, f"the patient worker ended too soon for the outage:\n{processing.log_tail()}"
        broker.stop()
        down = time.monotonic()
        release.touch()  # the patient worker processes on while the broker is down
        started_during = run_worker(impatient_spec, lab.log("started-during-the-outage"), impatient_timeout + 120)
        impatient.runs.append(summarize("started during the outage", started_during))
        time.sleep(max(0.0, outage_seconds - (time.monotonic() - down)))
        broker.start()
        up = time.monotonic()
        for result, spec, worker in ((patient, patient_spec, processing), (impatient, impatient_spec, restoring)):
            result.faults += 1
            result.counters["outage seconds"] = round(up - down)
            through = worker.finish(300)
            result.runs.append(summarize("through the outage", through, spec))
            if through.error is None:
                result.recovery_seconds = through.ended - up
                count_uncommitted_applied(result, lab)
                judge(result, spec)
            else:
                finish_with(result, spec, lab, "next run")
    return [patient, impatient]


# ---------------------------------------------------------------------------------------------
# 4. Corrupted store


def flush_to_sst(spec: WorkerSpec) -> None:
    """Write every store partition's memtable to SST files, where a failing disk damages data."""
    app = build_app(spec)
    for partition in range(spec.partitions):
        part = app.state.partition(STORE, partition)
        part.open()
        try:
            part.db.flush()
        finally:
            part.close()


def damage_sst(partition_dir: Path, newest: bool) -> Path:
    """Overwrite 64 bytes a quarter into one of the store data's SST files, as a failing disk would
    (like `state_damage.damage_data_block`, which picks the largest file): the newest one, whose blocks
    processing reads, or the oldest one, whose values newer files shadow. Each flush writes a file of
    the data and a small one of the two offsets; the data's are the larger ones."""
    tables = sorted(partition_dir.glob("*.sst"))
    middle = statistics.median(table.stat().st_size for table in tables)
    data = [table for table in tables if table.stat().st_size > middle] or tables
    table = data[-1] if newest else data[0]
    with table.open("r+b") as file:
        file.seek(table.stat().st_size // 4)
        file.write(b"\x00" * 64)
    return table


def corrupted_store(
    lab: Lab, orders: int = 6000, customers: int = 600, partitions: int = 3, rounds: int = 1
) -> FaultResult:
    """Between runs, damage a data block of a store partition's newest SST file (a failing disk),
    partition after partition; the next run meets the damage while processing and must move the store
    aside, restore it from the changelog, blame no message (the app skips bad messages, so blame would
    show as skipped orders) and count every order once."""
    result = FaultResult("4 corrupted store (a block processing reads)")
    chunk = orders // (rounds + 1)
    source = lab.orders_topic(partitions, chunk, customers)
    spec = lab.spec(source, partitions, on_error="skip")
    result.runs.append(summarize("before the damage", run_worker(spec, lab.log("before")), spec))
    app = build_app(spec)
    recovery = 0.0
    for round_ in range(rounds):
        partition = round_ % partitions
        flush_to_sst(spec)
        damage_sst(app.state.partition_path(STORE, partition), newest=True)
        result.faults += 1
        produce_orders(lab.bootstrap, source, make_orders(chunk, customers, start=chunk * (round_ + 1)))
        outcome = run_worker(spec, lab.log("after-the-damage"))
        result.runs.append(summarize(f"after damaging partition {partition}", outcome, spec))
        recovery = max(recovery, outcome.seconds)
        report = outcome.report or {}
        for name in ("skipped", "dead_lettered", "stores_recovered"):
            result.counters[name] = result.counters.get(name, 0) + int(report.get(name, 0))
    result.counters["corrupt copies kept"] = sum(len(app.state.corrupt_copies(STORE, p)) for p in range(partitions))
    judge(result, spec)
    result.recovery_seconds = recovery
    return result


def shadowed_corruption(
    lab: Lab, orders: int = 6000, customers: int = 600, partitions: int = 3, later_runs: int = 4
) -> FaultResult:
    """Damage the OLDEST data SST of partition 0 after three runs, each flushed to its own SST and each
    updating every customer: newer files shadow every value in it, so processing never reads the
    damaged block. Then orders keep
    coming, run after run (opening a store turns the last run's log into one more file, and RocksDB
    compacts once there are four: the compaction reads the damaged block). The engine should find
    the damage and restore the store as in `corrupted_store`. What it does is recorded: runs that
    failed, and customers the store's own iteration (digests, checks) missed. If runs keep failing,
    the operator clears partition 0's local state (the way out that works) and the final run must
    lose nothing."""
    result = FaultResult("4 corrupted store (a block newer files shadow)")
    chunk = max(orders // (3 + later_runs), customers)  # every run updates every customer
    source = lab.orders_topic(partitions, 0, customers)
    spec = lab.spec(source, partitions, on_error="skip")
    app = build_app(spec)
    produced = 0
    for turn in range(3):
        produce_orders(lab.bootstrap, source, make_orders(chunk, customers, start=produced))
        produced += chunk
        result.runs.append(summarize(f"before the damage #{turn + 1}", run_worker(spec, lab.log("before")), spec))
        flush_to_sst(spec)
    damage_sst(app.state.partition_path(STORE, 0), newest=False)
    result.faults += 1
    failed = 0
    for turn in range(later_runs):
        produce_orders(lab.bootstrap, source, make_orders(chunk, customers, start=produced))
        produced += chunk
        outcome = run_worker(spec, lab.log("after-the-damage"))
        result.runs.append(summarize(f"after the damage #{turn + 1}", outcome, spec))
        if turn == 0:
            expected = expected_from_source(lab.bootstrap, source)
            missed = read_store(spec, expected).missed_by_iteration
            result.counters["customers the store's iteration missed after the damage"] = len(missed)
        if outcome.error is not None:
            failed += 1
            if failed == 2:
                break  # it fails again when run again, as its error advises: the worker is stuck
    result.counters["runs that failed after the damage"] = failed
    result.counters["corrupt copies kept"] = len(app.state.corrupt_copies(STORE, 0))
    if failed:
        app.clear_state(partitions=[0])
        result.notes.append("the worker was stuck: partition 0's local state was cleared by hand")
    return finish_with(result, spec, lab)


# ---------------------------------------------------------------------------------------------
# 5. Changelog deleted and recreated


def recreate_topic(bootstrap: str, topic: str, partitions: int, config: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    admin.delete_topics([topic])[topic].result(timeout=30)
    wait_for(lambda: topic not in admin.list_topics(timeout=10).topics, 60, f"{topic} to be deleted")

    def created() -> bool:
        try:
            create_topic(bootstrap, topic, partitions=partitions, config=config)
            return True
        except Exception:  # noqa: BLE001 - the deletion may still be in progress on the broker
            return False

    wait_for(created, 60, f"{topic} to be created again")


def delete_group(bootstrap: str, group: str) -> None:
    """Delete the consumer group and its committed offsets (it must have no member)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    admin.delete_consumer_groups([group], request_timeout=30)[group].result(timeout=30)


def recreated_changelog(lab: Lab, orders: int = 3000, customers: int = 300, partitions: int = 3) -> FaultResult:
    """After a clean run, the changelog is deleted and created again (empty) and more orders arrive.
    The next run must stop with a RecoveryError naming the options and commit nothing. Then both ways
    out are followed: option (2) of the error (accept the loss: clear the local state, restore from
    what the changelog holds now), kept as a side route, and option (1), reprocessing the source from
    its beginning (clear the state and delete the group's offsets), whose result is the case's."""
    result = FaultResult("5 changelog deleted and recreated")
    source = lab.orders_topic(partitions, orders // 2, customers)
    spec = lab.spec(source, partitions)
    result.runs.append(summarize("before", run_worker(spec, lab.log("before")), spec))
    app = build_app(spec)
    changelog = app.changelog_topic(STORE)
    recreate_topic(lab.bootstrap, changelog, partitions, {"cleanup.policy": "compact", **COMPACT_FAST})
    result.faults += 1
    produce_orders(lab.bootstrap, source, make_orders(orders - orders // 2, customers, start=orders // 2))
    before = progress_of(spec)
    result.runs.append(summarize("after the recreation", run_worker(spec, lab.log("refused")), spec))
    result.changed_by_failed_run = changes(before, progress_of(spec))

    app.clear_state()
    option_two = run_worker(spec, lab.log("option-2"))
    result.runs.append(summarize("option (2): local state cleared, the loss accepted", option_two, spec))
    expected = expected_from_source(lab.bootstrap, source)
    result.side_routes["option (2): accept the loss"] = compare(expected, read_counts(spec, expected))

    app.clear_state()
    delete_group(lab.bootstrap, app.consumer_group)
    return finish_with(result, spec, lab, "reprocessed from the beginning")


# ---------------------------------------------------------------------------------------------
# 6. Source offset cut by retention


def retention_cut(
    lab: Lab, orders: int = 3000, customers: int = 300, partitions: int = 3, cut: int = 200
) -> FaultResult:
    """After a clean run more orders arrive, and partition 0 of the source loses its records up to
    `cut` past the group's committed offset (retention, `delete_records`). The next run must stop
    with a RecoveryError naming the options and commit nothing. The operator then accepts the gap
    (moves the group to the low watermark); the final state must hold every order that is left."""
    result = FaultResult("6 source offset cut by retention")
    source = lab.orders_topic(partitions, orders // 2, customers)
    spec = lab.spec(source, partitions)
    result.runs.append(summarize("before", run_worker(spec, lab.log("before")), spec))
    produce_orders(lab.bootstrap, source, make_orders(orders - orders // 2, customers, start=orders // 2))
    app = build_app(spec)
    every_order = source_messages(lab.bootstrap, source)  # read back before any is deleted
    committed = committed_offsets(lab.bootstrap, app.consumer_group, source, partitions)[0] or 0
    admin = AdminClient({"bootstrap.servers": lab.bootstrap, **QUIET})
    for future in admin.delete_records([TopicPartition(source, 0, committed + cut)]).values():
        future.result(timeout=30)
    low = watermarks(lab.bootstrap, source, partitions)[0][0]
    result.faults += 1
    result.counters["orders deleted before processing (the accepted gap)"] = low - committed
    before = progress_of(spec)
    result.runs.append(summarize("after the cut", run_worker(spec, lab.log("refused")), spec))
    result.changed_by_failed_run = changes(before, progress_of(spec))

    moved = admin.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(app.consumer_group, [TopicPartition(source, 0, low)])], request_timeout=30
    )
    for future in moved.values():
        future.result(timeout=30)
    outcome = run_worker(spec, lab.log("gap-accepted"))
    result.runs.append(summarize("gap accepted", outcome, spec))
    result.recovery_seconds = outcome.seconds
    kept = [m.value() for m in every_order if not (m.partition() == 0 and committed <= (m.offset() or 0) < low)]
    expected = tally(kept)
    return result.judge(expected, read_store(spec, expected))


# ---------------------------------------------------------------------------------------------
# 7. Read-only state directory


class ReadOnlyMoment(StrEnum):
    BEFORE_START = "before the run"
    WHILE_RUNNING = "while the worker runs"


def read_only_state(
    lab: Lab, moment: ReadOnlyMoment, orders: int = 3000, customers: int = 300, partitions: int = 3
) -> FaultResult:
    """The state directory becomes read-only (`moment`: before a run, or while a worker runs). The
    worker runs as an unprivileged user when the test runs as root (root ignores permissions). It
    must stop with a clear StateStoreError and lose nothing; once the directory is writable again
    the next run completes without loss."""
    result = FaultResult(f"7 read-only state directory ({moment})")
    user = UNPRIVILEGED_USER if os.geteuid() == 0 else None
    root = Path(tempfile.mkdtemp(prefix="fault-read-only-"))  # outside pytest's root-only tmp tree
    try:
        os.chmod(root, 0o755)
        if user is not None:
            shutil.chown(root, user, user_group(user))
        source = lab.orders_topic(partitions, orders // 2, customers)
        spec = lab.spec(source, partitions, state_dir=str(root), step_delay=0.05)
        result.runs.append(summarize("before", run_worker(spec, lab.log("before"), user=user), spec))
        produce_orders(lab.bootstrap, source, make_orders(orders - orders // 2, customers, start=orders // 2))
        if moment == ReadOnlyMoment.BEFORE_START:
            _make_read_only(root)
            outcome = run_worker(spec, lab.log("read-only"), user=user)
        else:
            with WorkerProcess(spec, lab.log("read-only"), user=user) as worker:
                wait_until_processed(worker, 1)
                _make_read_only(root)
                outcome = worker.finish(180)
        result.faults += 1
        result.runs.append(summarize("read-only", outcome, spec))
        result.notes.append(f"state directory {root}; worker user {user or 'the test user'}")
        subprocess.run(["chmod", "-R", "u+w", str(root)], check=True)
        outcome = run_worker(spec, lab.log("writable-again"), user=user)
        result.runs.append(summarize("writable again", outcome, spec))
        result.recovery_seconds = outcome.seconds
        return judge(result, spec, user)
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(root)], check=False)
        shutil.rmtree(root, ignore_errors=True)


def _make_read_only(root: Path) -> None:
    subprocess.run(["chmod", "-R", "a-w", str(root)], check=True)
