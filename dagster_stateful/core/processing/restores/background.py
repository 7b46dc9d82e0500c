"""Full restores of a worker's newly assigned partitions on the machine's other cores.

Owns `BackgroundRestores`, which the worker asks, once it has opened newly assigned partitions, to
spread the full restores they need (no local state, kept in RocksDB) over its free cores. The
restores are split into groups of about equal record counts; the worker's own process keeps the
first group (replayed between polls, as every restore is) unless it is replaying one already, and
child processes (`parallel_replay.ReplayChild`) replay the other groups into SST files while the
worker keeps polling. In its partition's pending replays a `ChildReplay` stands in for each
restore a child runs, with `ChangelogRestore`'s interface: `step()` only looks whether the child
has ended, `finish()` ingests the child's files. A child only makes a restore faster, never
different: when one fails, the worker's own process replays its partitions from the start (a
lasting cause then fails there, as it would have anyway). Suspending one of its restores
(revocation, shutdown) ends the child; its other restores go back to the worker's process alike.
A worker without local state starts its children ahead (`start_ahead`), while it joins its group,
so that their start-up is not part of the restore.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterable
from typing import Any

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.monitoring.listeners import Listeners
from dagster_stateful.core.monitoring.report import RestoreReport
from dagster_stateful.core.recovery.changelog_replay import FULL_RESTORE_CHUNK_RECORDS, ChangelogRestore
from dagster_stateful.core.recovery.child_processes import balanced_groups
from dagster_stateful.core.recovery.parallel_replay import (
    ReplayChild,
    ReplayedPartition,
    ReplayJob,
    child_work,
    ingest_replayed,
    portable_settings,
    replay_job,
    replayable,
)
from dagster_stateful.core.recovery.restore_log import RESTORE_REPORT_FIELD, log_restored
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.errors import RecoveryError

log = logging.getLogger(__name__)


class ChildReplay:
    """A full restore that a child process runs, in place of `in_process` (never started)."""

    def __init__(self, in_process: ChangelogRestore, store: StorePartition, job: ReplayJob, listeners: Listeners):
        self.in_process = in_process
        """The restore the worker's own process runs instead when the child cannot."""
        self.store = store
        self.report = in_process.report
        self.job = job
        self.handed_back = False
        """Set when the child failed or ended early: the worker's process replays this store itself."""
        self.child: _Child | None = None
        self.replayed: ReplayedPartition | None = None
        self._listeners = listeners
        self._launched = time.monotonic()
        listeners.restore_start(store.partition, store.store, in_process.start, in_process.end)

    @property
    def started(self) -> bool:
        return True

    @property
    def done(self) -> bool:
        return self.replayed is not None

    @property
    def records_left(self) -> int:
        return 0 if self.done else self.in_process.records_left

    def step(self) -> int:
        """Look whether the child has ended (without waiting); restores apply nothing before `finish()`."""
        if self.child is not None:
            self.child.poll()
        return 0

    def finish(self) -> RestoreReport:
        """Ingest the child's SST files into the store, with the position its restore reached."""
        assert self.replayed is not None, "finish() follows done"
        report = ingest_replayed(self.store, self.replayed, self.in_process.committed_source_offset, self._launched)
        self.store.changelog_prefix = self.in_process.committed_prefix(report)
        shutil.rmtree(self.job.directory, ignore_errors=True)
        self.report = report
        partition, store = self.store.partition, self.store.store
        self._listeners.batch_restored(partition, store, self.replayed.position, report.records_applied)
        self._listeners.restore_end(partition, store, report.records_applied)
        log_restored(report, self.store.changelog_topic, f"{report.kind}, in a child process")
        return report

    def suspend(self) -> RestoreReport:
        """Stop (revocation, shutdown): the child ends and the store stays empty, to be restored fully
        by its next owner; the child's other restores go back to the worker's process."""
        if self.child is not None:
            self.child.end()
        shutil.rmtree(self.job.directory, ignore_errors=True)
        self.report.completed = False
        self.report.seconds = time.monotonic() - self._launched
        self._listeners.restore_suspended(self.store.partition, self.store.store, 0)
        log.info(
            "Stopped the restore of store %r partition %d in a child process; the store stays empty and its next "
            "owner restores it fully",
            self.store.store,
            self.store.partition,
            extra={RESTORE_REPORT_FIELD: self.report},
        )
        return self.report

    def hand_back(self) -> None:
        self.handed_back = True
        self.child = None
        shutil.rmtree(self.job.directory, ignore_errors=True)


class _Child:
    """One child process and the restores it runs."""

    def __init__(self, process: ReplayChild, members: list[ChildReplay]) -> None:
        self.process = process
        self.members = members
        self.ended = False
        for member in members:
            member.child = self

    def poll(self) -> None:
        if self.ended:
            return
        try:
            results = self.process.result(wait=False)
        except RecoveryError as error:
            log.warning("%s. This worker replays them itself instead.", error)
            self.end()
            return
        if results is None:
            return
        self.ended = True
        for member, replayed in zip(self.members, results, strict=True):
            member.replayed = replayed

    def end(self) -> None:
        """Kill the child if it still runs; hand back every restore it has not finished."""
        self.ended = True
        self.process.kill()
        for member in self.members:
            if not member.done:
                member.hand_back()


class BackgroundRestores:
    """Launches the full restores of a worker's new partitions in child processes, at most one per
    free core (`processes` counts the worker's own)."""

    def __init__(
        self,
        kafka: KafkaClients,
        group: str,
        listeners: Listeners,
        processes: int,
        batch_size: int,
        chunk_records: int = FULL_RESTORE_CHUNK_RECORDS,
    ) -> None:
        self._listeners = listeners
        self._processes = processes
        settings = portable_settings(kafka.settings) if processes > 1 else None
        self._work: dict[str, Any] | None = None
        if settings is not None:
            self._work = child_work(kafka, settings, group, batch_size, chunk_records)
        self._children: list[_Child] = []
        self._waiting: list[ReplayChild] = []

    def start_ahead(self) -> None:
        """Start the child processes now, before any assignment (a worker without local state joining
        its group): they wait for their jobs, and the first `launch` or `close` ends the unused ones."""
        for _ in range(self._processes - 1 if self._work is not None else 0):
            process = self._spawn()
            if process is None:
                break
            self._waiting.append(process)
        log.debug("Started %d restore process(es) ahead of the first assignment", len(self._waiting))

    def close(self) -> None:
        """End the children started ahead that no restore needed."""
        for process in self._waiting:
            process.kill()
        self._waiting = []

    def launch(self, pending: Iterable[list[ChangelogRestore | ChildReplay]]) -> None:
        """Move the full restores not started yet among the partitions' `pending` ones to children, as
        many groups as there are free cores, keeping one group in this process unless it replays one
        already; each moved restore's `ChildReplay` takes its place in its list."""
        pending = list(pending)
        self._children = [child for child in self._children if not child.ended]
        free = self._processes - 1 - len(self._children)
        if self._work is None or free < 1:
            self.close()
            return
        waiting = [(replays, replay) for replays in pending for replay in _unstarted_full_restores(replays)]
        keep = 0 if _replaying_here(pending) else 1
        groups = balanced_groups(waiting, lambda item: item[1].records_left, min(len(waiting), free + keep))
        for group in groups[keep:]:
            self._start(group)
        self.close()

    def _start(self, group: list[tuple[list[ChangelogRestore | ChildReplay], ChangelogRestore]]) -> None:
        """Hand the group's restores to a child; without one, they stay in this process."""
        jobs = [
            replay_job(
                _store_of(replay),
                replay.committed_source_offset,
                (replay.start, replay.end),
                replay.committed_end,
                replay.bare_uncommitted,
            )
            for _, replay in group
        ]
        process = self._process_for(jobs)
        if process is None:
            return
        members = []
        for (replays, replay), job in zip(group, jobs, strict=True):
            member = ChildReplay(replay, _store_of(replay), job, self._listeners)
            replays[replays.index(replay)] = member
            members.append(member)
        self._children.append(_Child(process, members))
        log.info(
            "Replaying %s in a child process",
            ", ".join(f"store {m.store.store!r} partition {m.store.partition}" for m in members),
        )

    def _process_for(self, jobs: list[ReplayJob]) -> ReplayChild | None:
        """A child given `jobs`: one started ahead, else a new one; None when none can be started."""
        if self._work is None:
            return None
        if self._waiting:
            process = self._waiting.pop()
            if self._gave(process, jobs):
                return process
        spawned = self._spawn()
        return spawned if spawned is not None and self._gave(spawned, jobs) else None

    def _gave(self, process: ReplayChild, jobs: list[ReplayJob]) -> bool:
        assert self._work is not None
        try:
            process.give(self._work, jobs)
        except OSError as error:  # a child started ahead that has ended since
            log.info("A restore process started ahead has ended (%s); starting another", error)
            process.kill()
            return False
        return True

    def _spawn(self) -> ReplayChild | None:
        """A new child waiting for its jobs; None, with a warning and no more tries, when none can be
        started (this worker then replays its full restores in its own process)."""
        try:
            return ReplayChild()
        except OSError as error:
            log.warning(
                "Cannot start a restore process (%s): this worker replays its full restores in its own process",
                error,
            )
            self._work = None
            return None


def _store_of(replay: ChangelogRestore) -> StorePartition:
    store = replay.store
    assert isinstance(store, StorePartition), "only full restores of store partitions move to children"
    return store


def _unstarted_full_restores(replays: list[ChangelogRestore | ChildReplay]) -> list[ChangelogRestore]:
    return [
        replay
        for replay in replays
        if isinstance(replay, ChangelogRestore)
        and not replay.started
        and isinstance(replay.store, StorePartition)
        and replayable(replay.store)
    ]


def _replaying_here(pending: list[list[ChangelogRestore | ChildReplay]]) -> bool:
    return any(isinstance(replay, ChangelogRestore) and replay.started for replays in pending for replay in replays)


def background_restores(
    config: AppConfig, kafka: KafkaClients, listeners: Listeners, state: StateDirectory
) -> BackgroundRestores:
    """A worker's background restores: one process per core unless `restore_processes` says, started
    ahead when the worker has no local state (full restores are then likely, and their processes
    start while the group forms)."""
    processes = config.restore_processes or os.cpu_count() or 1
    background = BackgroundRestores(kafka, config.restore_group, listeners, processes, config.restore_batch_size)
    if config.changelog_topics() and not any(state.local_partitions(store) for store in config.stores):
        background.start_ahead()
    return background
