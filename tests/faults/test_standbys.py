"""Standby replicas against a real broker, with changelogs compacted as aggressively as the broker
allows: three members of one app, each with a state directory of its own (as pods with their own
volumes), one standby each, while orders keep coming. A member is SIGKILLed: each partition it
owned moves to the member holding its standby, whose restore applies at most one commit's records
(a full restore would apply the partition's every key); where a key lives (`App.key_location`) names
the member owning its partition and the one keeping its standby. The killed member comes back and keeps
standbys again. Two worker pools of two members, each pool on a host of its own (members of one
pool share its state directory): each pool keeps the standbys of the other's partitions, never its
own; when one host dies, its partitions move to the other, whose restores apply at most one
commit's records. A final worker's totals equal a recompute from the source: nothing lost under
at-least-once, exact under exactly-once."""

from __future__ import annotations

import os
import random
import re
from dataclasses import replace
from pathlib import Path

import pytest
from support.kafka_helpers import wait_for

from dagster_stateful.core import AppConfig
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.kafka.partitioner import partition_of
from dagster_stateful.core.queries.key_reads import ACTIVE, STANDBY
from dagster_stateful.core.state.checkpoint import read_checkpoint
from dagster_stateful.core.state.directory import StateDirectory
from faults.counting_worker import STORE, WorkerSpec, build_app
from faults.harness import (
    FaultResult,
    OrderFeeder,
    RunSummary,
    WorkerProcess,
    committed_offsets,
    source_messages,
    summarize,
    watermarks,
)
from faults.scenarios import AT_LEAST_ONCE, EXACTLY_ONCE, Lab, finish_with, wait_for_takeover

pytestmark = pytest.mark.integration

SEED = int(os.environ.get("FAULT_SEED") or random.SystemRandom().randrange(2**32))
PARTITIONS = 6
MEMBERS = 3
CUSTOMERS = 3_000
"""About 500 keys per partition: what a full restore of one would apply."""
COMMIT_EVERY = 100
"""The most changelog records one commit writes for a partition (one per message at most)."""
KEPT = re.compile(r"Keeps a standby of partition (\d+)")
RESTORE_DELAY = 2.0
"""Seconds each batch the member that came back restores takes: the window a read lands in."""
GONE = re.compile(
    r"(?:No longer keeps a standby of|Let go of the standby of|Dropped the standby of) partition (\d+)"
    r"|Partition (\d+) becomes active here, where its standby was kept"
)
"""A standby the member stopped keeping, or that became the partition's active copy there."""
RESUMED = re.compile(r"Partition (\d+) is up to date; processing resumes")


def kept_standbys(worker: WorkerProcess) -> set[int]:
    """The partitions the member keeps standbys of, as its log says."""
    kept: set[int] = set()
    for line in worker.log_path.read_text(errors="replace").splitlines():
        if found := KEPT.search(line):
            kept.add(int(found.group(1)))
        elif found := GONE.search(line):
            kept.discard(int(found.group(1) or found.group(2)))
    return kept


def every_partition_held(workers: list[WorkerProcess]) -> dict[int, int] | None:
    """Partition -> the member keeping its standby, once every partition has one (None before)."""
    holders = {p: i for i, w in enumerate(workers) for p in kept_standbys(w)}
    return holders if set(holders) == set(range(PARTITIONS)) else None


def changelog_position(state: StateDirectory, partition: int) -> int:
    """Where the member's copy of the partition stands in its changelog, by its checkpoint (-1: none yet)."""
    checkpoint = read_checkpoint(state.partition_path(STORE, partition))
    return -1 if checkpoint is None or checkpoint.changelog_offset is None else checkpoint.changelog_offset


def resumed_since(worker: WorkerProcess, lines: int) -> set[int]:
    """The partitions the member resumed processing (restored, or taken over) after its log's first `lines` lines."""
    tail = worker.log_path.read_text(errors="replace").splitlines()[lines:]
    return {int(found.group(1)) for line in tail if (found := RESUMED.search(line))}


def log_lines(worker: WorkerProcess) -> int:
    return len(worker.log_path.read_text(errors="replace").splitlines())


def standbys_within(specs: list[WorkerSpec], holders: dict[int, int], owned: dict[str, set[int]], records: int) -> bool:
    """Whether every standby is at most `records` changelog offsets behind its partition's active copy."""
    owner = {p: i for i, spec in enumerate(specs) for p in owned.get(spec.group_instance_id, ())}
    states = [StateDirectory(Path(spec.state_dir), AppConfig(name=spec.name, source=spec.source)) for spec in specs]
    return all(
        changelog_position(states[owner[p]], p) - changelog_position(states[holder], p) <= records
        and changelog_position(states[holder], p) >= 0
        for p, holder in holders.items()
    )


def all_committed_past(bootstrap: str, group: str, source: str, ends: dict[int, int]) -> bool:
    """Whether the group has committed every partition of `source` up to `ends` at least."""
    committed = committed_offsets(bootstrap, group, source, PARTITIONS)
    return all((committed[p] or 0) >= end for p, end in ends.items())


def owners(bootstrap: str, group: str, source: str) -> dict[str, set[int]] | None:
    """static id -> partitions, once the group is stable with every partition owned."""
    description = KafkaClients({"bootstrap.servers": bootstrap}).describe_group(group, source)
    if description.state != "STABLE":
        return None
    owned = {m.group_instance_id or m.member_id: set(m.partitions) for m in description.members}
    return owned if sum(len(p) for p in owned.values()) == PARTITIONS else None


def standby_lab(bootstrap: str, tmp_path: Path, guarantee: str) -> tuple[Lab, str, WorkerSpec]:
    """The lab, its orders topic and the members' common spec: one standby each, orders flowing."""
    lab = Lab(bootstrap, tmp_path, SEED)
    source = lab.orders_topic(PARTITIONS, 6_000, CUSTOMERS)
    base = lab.spec(
        source,
        PARTITIONS,
        until_caught_up=False,
        max_seconds=240,
        session_timeout_ms=3_000,
        commit_every=COMMIT_EVERY,
        num_standby_replicas=1,
        processing_guarantee=guarantee,
    )
    return lab, source, base


def gather_reports(result: FaultResult, workers: list[WorkerProcess], produced: int) -> list[RunSummary]:
    """Each member's run, summarized and added to `result`."""
    reports = [summarize(f"member {i}", w.finish(120)) for i, w in enumerate(workers)]
    result.runs.extend(reports)
    result.counters["orders produced while running"] = produced
    return reports


def assert_final_totals(result: FaultResult, lab: Lab, base: WorkerSpec, guarantee: str) -> None:
    """A final worker's totals equal a recompute from the source: nothing lost; exact under exactly-once."""
    final = replace(base, until_caught_up=True, num_standby_replicas=0, state_dir=str(lab.work_dir / "final"))
    finish_with(result, final, lab)
    assert result.lost == 0 and not result.totals_short, f"FAULT_SEED={SEED}\n{result.describe()}"
    if guarantee == EXACTLY_ONCE:
        assert result.doubled == 0, f"FAULT_SEED={SEED}\n{result.describe()}"


def read_during_restore(base: WorkerSpec, restoring: WorkerProcess, member: WorkerSpec) -> None:
    """Read a key of a partition `restoring` (the member that came back) restores: the answer comes
    from a fresher copy than its active one, and says so."""
    started = restoring.wait_for(
        lambda events: next(((e.data[0],) for e in events if e.kind == "restore_start"), None),
        120,
        "the member that came back to restore a partition",
    )
    assert started is not None, restoring.log_tail()
    (partition,) = started
    key = next(
        f"c{i}" for i in range(CUSTOMERS) if partition_of(f"c{i}".encode(), PARTITIONS, "consistent") == partition
    )
    read = build_app(base).read_key(STORE, key, partitioner="consistent")
    assert restoring.restoring(), f"the restore ended before the read; raise RESTORE_DELAY:\n{restoring.log_tail()}"
    assert read.location.active is not None and read.location.active.group_instance_id == member.group_instance_id
    assert read.from_standby and read.entries, read.describe()
    assert all(read.answered_by.behind <= copy.behind for copy in read.copies), read.describe()
    active = [copy for copy in read.copies if copy.role == ACTIVE]
    assert all(copy.behind > read.answered_by.behind for copy in active), read.describe()
    assert f"the {read.answered_by.role} copy" in read.describe() and "changelog records behind" in read.describe()


@pytest.mark.parametrize("guarantee", [AT_LEAST_ONCE, EXACTLY_ONCE])
def test_a_killed_members_partitions_move_to_their_standbys_and_restore_a_short_tail(
    kafka_bootstrap, tmp_path, guarantee
):
    lab, source, base = standby_lab(kafka_bootstrap, tmp_path, guarantee)
    specs = [
        replace(base, state_dir=str(tmp_path / f"member-{i}"), group_instance_id=f"{base.name}-{i}")
        for i in range(MEMBERS)
    ]
    result = FaultResult(f"standbys ({guarantee})")
    produced_first = {p: high for p, (_, high) in watermarks(kafka_bootstrap, source, PARTITIONS).items()}
    feeder = OrderFeeder(kafka_bootstrap, source, CUSTOMERS, rate=300).start()
    workers = [WorkerProcess(spec, lab.log(f"member-{i}")) for i, spec in enumerate(specs)]
    try:
        wait_for(
            lambda: all(len(kept_standbys(w)) == PARTITIONS // MEMBERS for w in workers),
            120,
            "each member to keep the standbys of two partitions",
        )
        before = wait_for(lambda: owners(kafka_bootstrap, base.name, source), 60, "a stable group")
        wait_for(
            lambda: all_committed_past(kafka_bootstrap, base.name, source, produced_first),
            120,
            "the members to commit the orders produced before them (every customer's first ones)",
        )
        dead = before[specs[0].group_instance_id]
        standby_holders = wait_for(
            lambda: every_partition_held(workers),
            60,
            "a standby of every partition on some member (the logs read between a standby's move and its start)",
        )
        wait_for(
            lambda: standbys_within(specs, standby_holders, before, COMMIT_EVERY),
            120,
            "every standby within one commit of its active copy",
        )
        location = build_app(base).key_location(STORE, "c7", partitioner="consistent")  # the test's producers'
        (arrived,) = {m.partition() for m in source_messages(kafka_bootstrap, source) if m.key() == b"c7"}
        assert location.partition == arrived and location.active is not None
        assert arrived in before[str(location.active.group_instance_id)], location.describe()
        assert [m.group_instance_id for m in location.standbys] == [specs[standby_holders[arrived]].group_instance_id]
        warm = build_app(base).read_key(STORE, "c7", partitioner="consistent")
        assert {copy.role for copy in warm.copies} >= {ACTIVE, STANDBY}, warm.describe()
        assert warm.answered_by.behind == min(copy.behind for copy in warm.copies) and warm.entries, warm.describe()
        seen = [len(w.events) for w in workers]
        workers[0].kill()
        for i in (1, 2):
            if any(standby_holders[p] == i for p in dead):
                wait_for_takeover(workers[i], seen[i], f"member {i} to take over the killed member's partitions")
        after = wait_for(lambda: owners(kafka_bootstrap, base.name, source), 60, "the group without member 0")
        workers[0] = WorkerProcess(replace(specs[0], restore_delay=RESTORE_DELAY), lab.log("member-0-back"))
        read_during_restore(base, workers[0], specs[0])
        wait_for(lambda: kept_standbys(workers[0]), 120, "the member that came back to keep standbys again")
    finally:
        produced = feeder.stop()
        for worker in workers:
            worker.terminate()
    reports = gather_reports(result, workers, produced)

    for partition in sorted(dead):
        holder = standby_holders[partition]
        assert partition in after[specs[holder].group_instance_id], f"partition {partition} moved to its standby"
        restores = [r for r in (reports[holder].report or {})["restores"] if r[0] == partition]
        assert restores and all(kind == "standby" for _, kind, _, _ in restores), restores
        applied = sum(records for _, _, records, _ in restores)
        assert applied <= COMMIT_EVERY, f"partition {partition}'s standby restore applied {applied} records"
    assert (reports[0].report or {})["standby_records"], "the member that came back keeps standbys"
    assert_final_totals(result, lab, base, guarantee)


HOSTS = 2
POOL = 2
"""Two worker pools of two members, each pool on a host of its own (its own state directory)."""


@pytest.mark.parametrize("guarantee", [AT_LEAST_ONCE, EXACTLY_ONCE])
def test_a_pools_partitions_are_kept_on_the_other_host_and_restore_a_short_tail_when_the_host_dies(
    kafka_bootstrap, tmp_path, guarantee
):
    lab, source, base = standby_lab(kafka_bootstrap, tmp_path, guarantee)
    specs = [
        replace(base, state_dir=str(tmp_path / f"host-{host}"), group_instance_id=f"{base.name}-{host}-{member}")
        for host in range(HOSTS)
        for member in range(POOL)
    ]
    host_of = {spec.group_instance_id: i // POOL for i, spec in enumerate(specs)}
    result = FaultResult(f"pools with standbys ({guarantee})")
    feeder = OrderFeeder(kafka_bootstrap, source, CUSTOMERS, rate=300).start()
    workers = [WorkerProcess(spec, lab.log(f"member-{i}")) for i, spec in enumerate(specs)]

    def kept_by_host() -> list[set[int]]:
        return [set().union(*(kept_standbys(w) for w in workers[h * POOL : (h + 1) * POOL])) for h in range(HOSTS)]

    def owned_by_host(owned: dict[str, set[int]]) -> list[set[int]]:
        return [set().union(*(p for m, p in owned.items() if host_of[m] == h)) for h in range(HOSTS)]

    def settled() -> dict[str, set[int]] | None:
        """The group's owners, once each host keeps standbys of exactly the other host's partitions."""
        owned = owners(kafka_bootstrap, base.name, source)
        return owned if owned and kept_by_host() == owned_by_host(owned)[::-1] else None

    try:
        before = wait_for(settled, 120, "each host's pool to keep the standbys of the other host's partitions")
        holders = {p: i for i, w in enumerate(workers) for p in kept_standbys(w)}
        wait_for(
            lambda: standbys_within(specs, holders, before, COMMIT_EVERY),
            120,
            "every standby within one commit of its active copy",
        )
        dead = owned_by_host(before)[0]
        assert dead, before
        logged = [log_lines(w) for w in workers]
        for worker in workers[:POOL]:
            worker.kill()
        wait_for(
            lambda: dead <= set().union(*(resumed_since(workers[i], logged[i]) for i in range(POOL, HOSTS * POOL))),
            120,
            "the other host's members to resume every partition of the dead host",
        )
        after = wait_for(lambda: owners(kafka_bootstrap, base.name, source), 60, "the group of the host left")
    finally:
        produced = feeder.stop()
        for worker in workers:
            worker.terminate()
    reports = gather_reports(result, workers, produced)

    assert owned_by_host(after)[1] == set(range(PARTITIONS)), after
    survivors = reports[POOL:]
    for partition in sorted(dead):
        restores = [r for report in survivors for r in (report.report or {})["restores"] if r[0] == partition]
        applied = sum(records for _, _, records, _ in restores)
        assert restores and all(kind == "standby" for _, kind, _, _ in restores), restores
        assert applied <= COMMIT_EVERY, f"partition {partition} restored {restores} on the other host"
    assert_final_totals(result, lab, base, guarantee)
