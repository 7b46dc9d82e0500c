"""Correct under every failure: real worker subprocesses, a real broker, faults injected on purpose.

Every case checks the final store against counts recomputed from the source topic read back from
Kafka (never against the engine's own figures): "lost" orders must be 0 in every case; "doubled"
ones are allowed under at-least-once where a crash left delivered but uncommitted work, and must be
0 where nothing crashed. The cases live in `faults.scenarios` (bench/bench_faults.py runs them at
scale); a failure message prints the whole case, including the random seed (set FAULT_SEED to
replay the same choices).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from faults.counting_worker import WORKER_FAILED
from faults.harness import FaultResult, KillPoint, RestartableBroker
from faults.scenarios import (
    AT_LEAST_ONCE,
    EXACTLY_ONCE,
    JOIN_MISMATCHES,
    UNCOMMITTED_APPLIED,
    Lab,
    ReadOnlyMoment,
    alternating_kills,
    broker_outage,
    corrupted_store,
    evicted_member_fenced,
    foreign_key_sigkill_storm,
    joined_sigkill_storm,
    kill_schedule,
    read_only_state,
    recreated_changelog,
    retention_cut,
    shadowed_corruption,
    sigkill_storm,
    windowed_sigkill_storm,
    zombie_fenced,
)

# Case 3 runs a broker of its own; every other case uses the session's (`kafka_bootstrap`).
pytestmark = pytest.mark.integration

STORM_KILLS = 10
"""Kills per storm: every kill point twice (bench/bench_faults.py runs longer storms)."""
MID_RESTORE_KILLS = sum(1 for point in kill_schedule(STORM_KILLS, random.Random(0)) if point is KillPoint.MID_RESTORE)
"""Each follows a deletion of the local state, so each begins a full restore."""

WINDOWED_KILLS = {EXACTLY_ONCE: 10, AT_LEAST_ONCE: len(KillPoint)}
"""Kills of the windowed storm: every kill point twice under exactly-once, whose check is exact;
once under at-least-once, whose check (nothing short) is the weaker one."""
WINDOW_MISMATCHES = (
    "closed windows missing from the output",
    "windows emitted more than once",
    "windows emitted with a wrong tally",
    "windows emitted with a short tally",
    "windows emitted that never closed",
    "kept windows missing from the store",
    "windows in the store not kept",
    "windows in the store with a wrong tally",
    "windows in the store with a short tally",
    "partitions with a wrong stream time",
    "late orders never dead-lettered",
    "late orders dead-lettered more than once",
    "orders dead-lettered that were not late",
)
"""What `windowed_sigkill_storm` finds against the windows recomputed from the source: all 0 under
exactly-once."""
SESSION_GAP_MS = 1_500
"""The sessions storm's inactivity gap: orders of one customer come about 0.8 s apart, so sessions
hold a handful of orders, and orders lagging behind bridge some of them."""
SLIDING_MS = 1_000
"""The sliding storm's time difference: orders of one customer come about 0.8 s apart, so windows
hold one to three, orders lagging behind land in windows made before them, and those lagging more
than the difference plus the grace (up to three graces) are late."""
AT_LEAST_ONCE_DOUBLES = (
    "windows emitted more than once",
    "windows emitted with a wrong tally",
    "windows in the store with a wrong tally",
    "late orders dead-lettered more than once",
)
"""What at-least-once allows: work redone after a kill is sent again (outputs and dead letters), and
a restore applies the changelog records of uncommitted messages whose committed record compaction
may have removed (see `recovery/uncommitted.py`), which the redone work then counts again: tallies
too high, never too low. Never a window missing or short, and never an order taken for late that
was not: redone work is judged by the stream time of the last commit."""

SEED = int(os.environ.get("FAULT_SEED") or random.SystemRandom().randrange(2**32))


def explain(result: FaultResult) -> str:
    """The whole case, for a failure message, with the seed that replays its random choices."""
    return f"FAULT_SEED={SEED}\n{result.describe()}"


def assert_nothing_lost(result: FaultResult) -> None:
    assert result.messages > 0, explain(result)
    assert result.lost == 0, f"at-least-once never loses:\n{explain(result)}"
    assert not result.totals_short, f"customers whose total is short:\n{explain(result)}"
    assert not result.unexpected, f"customers no order names:\n{explain(result)}"
    assert not result.unreadable, f"customers whose state cannot be read:\n{explain(result)}"
    assert not result.missed_by_iteration, f"the store's own iteration misses customers:\n{explain(result)}"


def assert_doubles_only_where_compaction_left_gaps(result: FaultResult) -> None:
    """At-least-once doubles state only through a restore that applied records of uncommitted
    messages, and a restore does that only where compaction left a gap in the range it read: with
    no such record applied, the state must be exact."""
    if result.counters[UNCOMMITTED_APPLIED] == 0:
        doubled = result.doubled
        assert doubled == 0, f"doubled {doubled} although no restore applied an uncommitted record:\n{explain(result)}"


def assert_exact(result: FaultResult) -> None:
    assert_nothing_lost(result)
    assert result.doubled == 0, f"nothing crashed, so nothing may count twice:\n{explain(result)}"


def assert_caught_up(result: FaultResult, label: str) -> None:
    run = result.run(label)
    assert run.error is None and run.stop_reason == "caught_up", explain(result)
    assert run.lag == 0, f"{label} stopped caught up with lag left by Kafka's committed offsets:\n{explain(result)}"


@pytest.mark.parametrize("guarantee", [AT_LEAST_ONCE, EXACTLY_ONCE])
def test_sigkill_at_random_points_ten_times_in_a_row_loses_nothing_from_columnar_aggregations(
    kafka_bootstrap, tmp_path, guarantee
):
    """The worker keeps its counts and totals with a columnar aggregation (`Mean("amount")`, folded a
    consumed batch at a time); the other storms' workers use a stateful apply."""
    lab = Lab(kafka_bootstrap, tmp_path, SEED)
    result = sigkill_storm(
        lab, orders=4_000, customers=600, partitions=3, kills=STORM_KILLS, guarantee=guarantee, aggregate=True
    )

    assert result.faults == STORM_KILLS, explain(result)
    landed = " ".join(result.points)  # "<kill point> (seen: <what the worker was doing>)"
    for point in KillPoint:
        assert point.value in landed, f"no kill aimed at {point.value}:\n{explain(result)}"
    assert "(seen: restoring)" in landed, f"no kill landed during a restore:\n{explain(result)}"
    assert result.counters["state deleted before a restart"] >= MID_RESTORE_KILLS, explain(result)
    assert result.counters["full restores begun"] >= MID_RESTORE_KILLS, explain(result)
    assert result.counters["changelog records compacted away"] > 0, f"compaction never ran:\n{explain(result)}"
    assert_caught_up(result, "final")
    if guarantee == EXACTLY_ONCE:
        assert_exact(result)
    else:
        assert_nothing_lost(result)
        assert_doubles_only_where_compaction_left_gaps(result)


def test_exactly_once_sigkill_at_random_points_ten_times_is_exact_and_each_output_appears_once(
    kafka_bootstrap, tmp_path
):
    lab = Lab(kafka_bootstrap, tmp_path, SEED)
    result = sigkill_storm(lab, orders=3_600, customers=300, partitions=3, kills=STORM_KILLS, guarantee=EXACTLY_ONCE)

    assert result.faults == STORM_KILLS, explain(result)
    landed = " ".join(result.points)
    assert KillPoint.COMMIT_AFTER_OFFSETS.value in landed, f"no kill between commit and store write:\n{explain(result)}"
    assert result.counters["full restores begun"] >= MID_RESTORE_KILLS, explain(result)
    assert_caught_up(result, "final")
    assert (result.lost, result.doubled) == (0, 0), f"exactly-once state is exact:\n{explain(result)}"
    assert (result.counters["outputs missing"], result.counters["outputs doubled"]) == (0, 0), explain(result)


@pytest.mark.parametrize("guarantee", [AT_LEAST_ONCE, EXACTLY_ONCE])
def test_sigkill_at_random_points_loses_nothing_across_a_global_table_and_a_repartition_topic(
    kafka_bootstrap, tmp_path, guarantee
):
    """Every order is joined (inner) with a global table of all customers, whose local copy is
    deleted with the rest of the state before some restarts, then goes through the app's
    repartition topic (`group_by("customer")`) before it is counted: a copy missing a customer
    would drop its orders. A kill between the re-keyed records and the source's commit sends them
    again, which at-least-once may count twice and exactly-once never does (its re-keyed records,
    counts and both topics' offsets commit in one transaction; each output appears once)."""
    lab = Lab(kafka_bootstrap, tmp_path, SEED)
    result = sigkill_storm(
        lab,
        orders=3_600,
        customers=300,
        partitions=3,
        kills=STORM_KILLS,
        guarantee=guarantee,
        regroup=True,
        lookup=True,
    )

    assert result.faults == STORM_KILLS, explain(result)
    landed = " ".join(result.points)
    for point in KillPoint:
        assert point.value in landed, f"no kill aimed at {point.value}:\n{explain(result)}"
    assert result.counters["full restores begun"] >= MID_RESTORE_KILLS, explain(result)
    assert result.counters["changelog records compacted away"] > 0, f"compaction never ran:\n{explain(result)}"
    assert_caught_up(result, "final")
    if guarantee == EXACTLY_ONCE:
        assert_exact(result)
        assert (result.counters["outputs missing"], result.counters["outputs doubled"]) == (0, 0), explain(result)
    else:
        assert_nothing_lost(result)


@pytest.mark.parametrize(
    ("guarantee", "regroup"),
    [(AT_LEAST_ONCE, False), (EXACTLY_ONCE, False), (AT_LEAST_ONCE, True), (EXACTLY_ONCE, True)],
)
def test_sigkill_at_random_points_loses_nothing_across_a_partitioned_table_join(
    kafka_bootstrap, tmp_path, guarantee, regroup
):
    """Every order is joined (inner, on its key) with a versioned table of all customers,
    co-partitioned with the orders, whose partitions are deleted with the rest of the state before
    some restarts (rebuilt from the table's compacted topic): a table partition missing a customer,
    or whose position was committed out of step with the orders (a kill between the changelog's
    records and the offsets' commit), would drop its orders. `regroup`: the join comes before
    `group_by`, beside the source's partitions, whose offsets commit the table's positions."""
    lab = Lab(kafka_bootstrap, tmp_path, SEED)
    result = sigkill_storm(
        lab,
        orders=3_600,
        customers=300,
        partitions=3,
        kills=STORM_KILLS,
        guarantee=guarantee,
        table=True,
        regroup=regroup,
    )

    assert result.faults == STORM_KILLS, explain(result)
    landed = " ".join(result.points)
    for point in KillPoint:
        assert point.value in landed, f"no kill aimed at {point.value}:\n{explain(result)}"
    assert result.counters["full restores begun"] >= MID_RESTORE_KILLS, explain(result)
    assert_caught_up(result, "final")
    if guarantee == EXACTLY_ONCE:
        assert_exact(result)
        assert (result.counters["outputs missing"], result.counters["outputs doubled"]) == (0, 0), explain(result)
    else:
        assert_nothing_lost(result)


@pytest.mark.parametrize(
    ("guarantee", "path"),
    [
        (EXACTLY_ONCE, "per-message"),
        (AT_LEAST_ONCE, "per-message"),
        (AT_LEAST_ONCE, "columns"),
        (EXACTLY_ONCE, "sessions"),
        (AT_LEAST_ONCE, "sessions"),
        (EXACTLY_ONCE, "sliding"),
        (AT_LEAST_ONCE, "sliding"),
    ],
)
def test_a_windowed_aggregation_sigkilled_at_random_points_emits_every_closed_window_and_keeps_the_live_ones(
    kafka_bootstrap, tmp_path, guarantee, path
):
    """Under exactly-once each closed window appears once (read_committed) with exactly its recomputed
    tally, none other does, the store holds exactly the unexpired windows with their tallies, and
    each late order is dead-lettered once. Under at-least-once each closed window appears at least
    once and no tally (emitted or stored) is short: orders may count twice, never zero times. The
    "columns" workers keep each window's `Sum("amount")`, folded a consumed batch at a time; they run
    under at-least-once, where crashes leave windows to be redone, and commit through the same
    transactions as the per-message path (the columnar storms above cover both guarantees). The
    "sessions" workers keep sessions of 1.5 s of inactivity instead, judged alike against the
    sessions recomputed from the source (a session split or merged wrongly is missing, unexpected
    or wrong), and the "sliding" workers sliding windows of 1 s, judged against the windows
    recomputed from the source."""
    lab = Lab(kafka_bootstrap, tmp_path, SEED)
    kills = WINDOWED_KILLS[guarantee]
    result = windowed_sigkill_storm(
        lab,
        orders=4_000,
        customers=24,
        partitions=3,
        kills=kills,
        guarantee=guarantee,
        columnar=path == "columns",
        session_gap_ms=SESSION_GAP_MS if path == "sessions" else 0,
        sliding_ms=SLIDING_MS if path == "sliding" else 0,
    )
    counters = result.counters

    assert result.faults == kills, explain(result)
    folding = counters["worker runs folding in columns"]
    assert folding > kills if path == "columns" else folding == 0, explain(result)
    landed = " ".join(result.points)
    for point in KillPoint:
        assert point.value in landed, f"no kill aimed at {point.value}:\n{explain(result)}"
    mid_restore_kills = sum(1 for point in kill_schedule(kills, random.Random(0)) if point is KillPoint.MID_RESTORE)
    assert counters["full restores begun"] >= mid_restore_kills, explain(result)
    assert_caught_up(result, "final")
    assert counters["windows closed (recomputed)"] >= 300, f"too few windows closed to judge:\n{explain(result)}"
    assert counters["windows kept (recomputed)"] > 0 and counters["late orders (recomputed)"] > 0, explain(result)
    allowed = AT_LEAST_ONCE_DOUBLES if guarantee == AT_LEAST_ONCE else ()
    found = {name: counters[name] for name in WINDOW_MISMATCHES if name not in allowed and counters[name]}
    assert not found, f"the windows differ from those recomputed from the source: {found}\n{explain(result)}"
    if guarantee == EXACTLY_ONCE:
        assert counters["final windows emitted"] == counters["windows closed (recomputed)"], explain(result)
    else:
        assert_doubles_only_where_compaction_left_gaps(result)


@pytest.mark.parametrize("guarantee", [EXACTLY_ONCE, AT_LEAST_ONCE])
def test_an_interval_join_sigkilled_at_random_points_sends_every_result_due_and_none_early(
    kafka_bootstrap, tmp_path, guarantee
):
    """An outer interval join of orders and payments under SIGKILL storms: under exactly-once each
    result due (every pair in reach, every record without a partner once closed) appears exactly
    once, read_committed; under at-least-once at least once; under either, nothing else (a record
    sent alone before its partner came would be)."""
    lab = Lab(kafka_bootstrap, tmp_path, SEED)
    kills = WINDOWED_KILLS[guarantee]
    result = joined_sigkill_storm(lab, orders=3_000, customers=24, partitions=3, kills=kills, guarantee=guarantee)
    counters = result.counters

    assert result.faults == kills, explain(result)
    landed = " ".join(result.points)
    for point in KillPoint:
        assert point.value in landed, f"no kill aimed at {point.value}:\n{explain(result)}"
    assert_caught_up(result, "final")
    assert counters["join pairs (recomputed)"] >= 2_000, f"too few pairs to judge:\n{explain(result)}"
    assert counters["join results sent alone (recomputed)"] >= 200, explain(result)
    allowed = ("join results doubled",) if guarantee == AT_LEAST_ONCE else ()
    found = {name: counters[name] for name in JOIN_MISMATCHES if name not in allowed and counters[name]}
    assert not found, f"the join differs from the one recomputed from both topics: {found}\n{explain(result)}"


@pytest.mark.parametrize("guarantee", [EXACTLY_ONCE, AT_LEAST_ONCE])
def test_a_table_join_sigkilled_at_random_points_ends_with_the_join_of_both_tables_last_values(
    kafka_bootstrap, tmp_path, guarantee
):
    """An outer table-table join of two topics read as tables (keyed by customer) under SIGKILL
    storms: each key's last output value is the join of its last values in both topics."""
    lab = Lab(kafka_bootstrap, tmp_path, SEED)
    kills = len(KillPoint)
    result = joined_sigkill_storm(lab, orders=2_000, partitions=3, kills=kills, guarantee=guarantee, tables=True)

    assert result.faults == kills, explain(result)
    assert_caught_up(result, "final")
    assert result.counters["join pairs (recomputed)"] >= 20, explain(result)
    found = {name: result.counters[name] for name in JOIN_MISMATCHES if result.counters[name]}
    assert not found, f"the join differs from the one of both tables' last values: {found}\n{explain(result)}"


def test_a_zombie_worker_is_fenced_and_none_of_its_writes_appear(kafka_bootstrap, tmp_path):
    result = zombie_fenced(Lab(kafka_bootstrap, tmp_path, SEED))

    assert result.counters["zombie exit code"] == WORKER_FAILED, f"the zombie stops with an error:\n{explain(result)}"
    assert any("fenced" in note.lower() for note in result.notes), explain(result)
    assert result.run("successor").lag == 0, explain(result)
    assert (result.lost, result.doubled) == (0, 0), explain(result)
    assert (result.counters["outputs missing"], result.counters["outputs doubled"]) == (0, 0), explain(result)


def test_a_member_the_group_evicted_is_fenced_by_its_generation_and_nothing_doubles(kafka_bootstrap, tmp_path):
    result = evicted_member_fenced(Lab(kafka_bootstrap, tmp_path, SEED))

    assert result.run("successor").stop_reason == "caught_up", explain(result)
    assert result.run("evicted").stop_reason == "caught_up", f"the evicted worker rejoined:\n{explain(result)}"
    assert result.counters["evicted worker's transactions aborted"] >= 1, f"its commit was refused:\n{explain(result)}"
    assert_caught_up(result, "restored from the changelogs")
    assert (result.lost, result.doubled) == (0, 0), f"the changelogs hold the committed work:\n{explain(result)}"
    assert (result.counters["outputs missing"], result.counters["outputs doubled"]) == (0, 0), explain(result)


@pytest.fixture(scope="module")
def two_workers(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> FaultResult:
    lab = Lab(kafka_bootstrap, tmp_path_factory.mktemp("two-workers"), SEED)
    return alternating_kills(lab, kills=4, customers=400, partitions=4)


def test_two_workers_killed_in_turn_while_rebalancing_lose_nothing(two_workers):
    result = two_workers
    assert result.faults == 4, explain(result)
    for label in "AB":
        run = result.run(f"{label} stopped by SIGTERM")
        assert run.error is None and run.stop_reason == "stop requested (SIGTERM)", explain(result)
    # Each kill was followed by the survivor taking over (the scenario waits for it); how many
    # rebalances the survivor counts depends on how the group merged the join and the leave.
    assert result.counters["rebalances seen by the survivor of the last kill"] >= 1, explain(result)
    assert_caught_up(result, "final")
    assert_nothing_lost(result)
    assert_doubles_only_where_compaction_left_gaps(result)


def test_after_the_rebalances_both_workers_report_running_while_they_process(two_workers):
    assert two_workers.counters["workers processing while their state said REBALANCING"] == 0, explain(two_workers)


def test_a_broker_outage_is_waited_out_or_stops_the_worker_clearly_and_loses_nothing(tmp_path_factory, tmp_path):
    broker = RestartableBroker(tmp_path_factory.mktemp("outage-broker"))
    bootstrap = broker.start()
    try:
        patient, impatient = broker_outage(Lab(bootstrap, tmp_path, SEED), broker, orders=3000, impatient_timeout=3.0)
    finally:
        broker.stop()

    assert patient.counters["outage seconds"] > 3, "longer than the session timeout: the group lost its members"
    assert_caught_up(patient, "through the outage")
    assert_nothing_lost(patient)
    assert_doubles_only_where_compaction_left_gaps(patient)

    during = impatient.run("started during the outage")
    assert during.error is not None and during.error.is_a("KafkaOperationError"), explain(impatient)
    assert bootstrap in during.error.message and "admin_timeout_seconds" in during.error.message, explain(impatient)
    through = impatient.run("through the outage")
    if through.error is None:  # it waited the outage out too
        assert_caught_up(impatient, "through the outage")
    else:
        assert through.error.is_a("StatefulError"), f"not a clear error:\n{explain(impatient)}"
        assert_caught_up(impatient, "next run")
    assert_nothing_lost(impatient)


def test_a_corrupted_store_is_restored_and_no_message_is_blamed(kafka_bootstrap, tmp_path):
    result = corrupted_store(Lab(kafka_bootstrap, tmp_path, SEED), orders=6000, customers=600, partitions=3)

    assert_caught_up(result, "after damaging partition 0")
    assert result.counters["corrupt copies kept"] >= 1, f"the damage went unnoticed:\n{explain(result)}"
    assert result.counters["skipped"] == 0 and result.counters["dead_lettered"] == 0, explain(result)
    assert_exact(result)


@pytest.fixture(scope="module")
def shadowed(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> FaultResult:
    return shadowed_corruption(Lab(kafka_bootstrap, tmp_path_factory.mktemp("shadowed"), SEED), orders=6000)


def test_a_damaged_block_newer_files_shadow_loses_nothing_once_the_store_is_rebuilt(shadowed):
    assert_caught_up(shadowed, "final")
    assert_nothing_lost(shadowed)


def test_a_damaged_block_newer_files_shadow_is_found_and_restored_by_the_engine(shadowed):
    missed = shadowed.counters["customers the store's iteration missed after the damage"]
    assert missed == 0, f"the store's iteration silently missed {missed} customers:\n{explain(shadowed)}"
    assert shadowed.counters["runs that failed after the damage"] == 0, explain(shadowed)
    assert shadowed.counters["corrupt copies kept"] >= 1, f"the damage was never found:\n{explain(shadowed)}"


@pytest.fixture(scope="module")
def recreated(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> FaultResult:
    return recreated_changelog(Lab(kafka_bootstrap, tmp_path_factory.mktemp("recreated"), SEED), orders=3000)


def test_a_recreated_changelog_stops_the_worker_with_the_options_and_commits_nothing(recreated):
    refused = recreated.run("after the recreation").error
    assert refused is not None and refused.is_a("RecoveryError"), explain(recreated)
    assert "changelog" in refused.message and "Options" in refused.message, refused.message
    option_one = refused.message.split("(1)")[1].split("(2)")[0]
    assert "reprocess" in option_one and "--delete-offsets" in option_one and "clear" in option_one, refused.message
    assert recreated.changed_by_failed_run == [], explain(recreated)
    assert_caught_up(recreated, "reprocessed from the beginning")
    assert_exact(recreated)


def test_the_recreated_changelog_errors_lossy_option_says_so_and_does_lose(recreated):
    message = recreated.run("after the recreation").error.message
    assert "LOSES" in message.split("(2)")[1], message
    accepted = recreated.side_routes["option (2): accept the loss"]
    assert accepted.lost > 0, f"option (2) lost nothing, so its warning is wrong:\n{explain(recreated)}"


def test_a_source_offset_cut_by_retention_stops_the_worker_with_the_options_and_commits_nothing(
    kafka_bootstrap, tmp_path
):
    result = retention_cut(Lab(kafka_bootstrap, tmp_path, SEED), orders=3000, cut=200)

    refused = result.run("after the cut").error
    assert refused is not None and refused.is_a("RecoveryError"), explain(result)
    assert "low watermark" in refused.message and "--reset-offsets" in refused.message, refused.message
    assert result.changed_by_failed_run == [], explain(result)
    assert result.counters["orders deleted before processing (the accepted gap)"] == 200, explain(result)
    assert_caught_up(result, "gap accepted")
    assert_exact(result)


@pytest.fixture(scope="module", params=[ReadOnlyMoment.BEFORE_START, ReadOnlyMoment.WHILE_RUNNING])
def read_only(
    request: pytest.FixtureRequest, kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> FaultResult:
    work_dir: Path = tmp_path_factory.mktemp("read-only")
    return read_only_state(Lab(kafka_bootstrap, work_dir, SEED), request.param, orders=3000)


def test_a_read_only_state_directory_stops_the_worker_and_loses_nothing(read_only):
    assert read_only.run("read-only").error is not None, f"the worker did not stop:\n{explain(read_only)}"
    assert_caught_up(read_only, "writable again")
    assert_nothing_lost(read_only)


def test_a_read_only_state_directory_stops_the_worker_with_a_clear_state_store_error(read_only):
    error = read_only.run("read-only").error
    assert error is not None and error.is_a("StateStoreError"), explain(read_only)
    assert "fault-read-only-" in error.message, f"the message does not name the path: {error.message}"


@pytest.mark.parametrize("guarantee", [EXACTLY_ONCE, AT_LEAST_ONCE])
def test_a_foreign_key_join_sigkilled_at_random_points_ends_with_each_orders_join_with_its_customer(
    kafka_bootstrap, tmp_path, guarantee
):
    """A foreign-key join of orders (a table) with a global table of customers under SIGKILL storms,
    both tables updated and deleted between runs: each order's last output value is its last value
    merged with its customer's last value, and no order the join does not hold has a value."""
    lab = Lab(kafka_bootstrap, tmp_path, SEED)
    kills = len(KillPoint)
    result = foreign_key_sigkill_storm(lab, updates=2_000, partitions=3, kills=kills, guarantee=guarantee)

    assert result.faults == kills, explain(result)
    assert_caught_up(result, "final")
    assert result.counters["join pairs (recomputed)"] >= 100, explain(result)
    found = {name: result.counters[name] for name in JOIN_MISMATCHES if result.counters[name]}
    assert not found, f"the join differs from the one of both tables' last values: {found}\n{explain(result)}"
