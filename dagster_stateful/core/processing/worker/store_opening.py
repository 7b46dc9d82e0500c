"""Opening the stores of a newly assigned partition and choosing how each one restores.

Owns `StoreOpener`: between polls, it opens an assigned partition's stores (waiting for a lock the
evicted owner still holds without blocking the loop), decides where processing starts and wipes
local state ahead of it, and picks each store's restore: a snapshot load when the planner says it
is faster, then the changelog replay, reported as a standby's when a standby of this client kept
the store warm. A store found damaged while it restores is moved aside and restored from scratch;
`damaged_store` finds the store a corruption error names, for the worker's recovery of a store
found damaged while processing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.monitoring.report import RestoreKind, RestoreReport, WorkerReport
from dagster_stateful.core.processing.restores.background import ChildReplay
from dagster_stateful.core.processing.restores.state_updater import Restorations, RestoringPartition, suspend_started
from dagster_stateful.core.processing.worker.starting_offsets import StartingOffsets
from dagster_stateful.core.recovery.changelog_replay import ChangelogRestore
from dagster_stateful.core.recovery.restorer import Restorer
from dagster_stateful.core.recovery.snapshot_format import SnapshotStore
from dagster_stateful.core.recovery.snapshot_load import load_snapshot_if_faster
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.errors import StateLockedError, StoreCorruptedError

log = logging.getLogger(__name__)


class StoreOpener:
    """Opens assigned partitions' stores and starts their restores, for `PartitionAssignments`."""

    def __init__(
        self,
        config: AppConfig,
        state: StateDirectory,
        starts: StartingOffsets,
        restorations: Restorations,
        report: WorkerReport,
        restorer: Restorer | None,
        kafka: KafkaClients,
        snapshots: Callable[[str], SnapshotStore] | None,
    ) -> None:
        self.config = config
        self._state = state
        self._starts = starts
        self.restorations = restorations
        self._report = report
        self._restorer = restorer
        self._kafka = kafka
        self._snapshots = snapshots

    def try_open(self, restoring: RestoringPartition) -> None:
        """Open the partition's stores without waiting for a lock another holder keeps (the evicted
        owner may still be letting go): try again on the next call, until the state directory's
        lock timeout has passed since the assignment."""
        partition = restoring.partition
        try:
            for name in self.config.stores:
                if name not in restoring.stores:
                    store = self._state.partition(name, partition)
                    store.open(lock_timeout=0)
                    restoring.stores[name] = store
        except StateLockedError:
            if time.monotonic() - restoring.assigned_at < self._state.lock_timeout_seconds:
                return
            raise
        try:
            restoring.committed = self._starts.starting_offset(partition, restoring.committed, restoring.stores)
            self._starts.wipe_ahead(partition, restoring.committed, restoring.stores)
            restoring.pending = self.replays(restoring)
        except BaseException:
            self.restorations.suspend(partition)
            for store in restoring.stores.values():
                store.close()
            raise
        restoring.opened = True
        if restoring.pending:
            log.info(
                "Partition %d is paused while %d store(s) restore %d changelog records",
                partition,
                len(restoring.pending),
                restoring.records_left,
            )

    def replays(self, restoring: RestoringPartition) -> list[ChangelogRestore | ChildReplay]:
        if self._restorer is None:
            return []
        replays: list[ChangelogRestore | ChildReplay] = []
        for store in restoring.stores.values():
            warm = restoring.from_standby or store.kept_by_standby
            if self._snapshots is not None and not warm:
                self._load_snapshot_if_faster(store)
            end = restoring.changelog_ends.get(store.store)
            replay = self._restorer.begin(store, restoring.committed, end, restoring.bare_uncommitted)
            if warm:
                self._note_standby_restore(store, replay)
            if replay is not None:
                replays.append(replay)
        return replays

    def _note_standby_restore(self, store: StorePartition, replay: ChangelogRestore | None) -> None:
        """Report a store that a standby of this client kept as such: its tail, or nothing left to apply."""
        if replay is None:
            at = store.changelog_offset or 0
            self.restorations.reports.append(RestoreReport(store.store, store.partition, RestoreKind.STANDBY, at, at))
            log.info("Store %r partition %d: its standby was up to date", store.store, store.partition)
        elif replay.report.kind is RestoreKind.PARTIAL:
            replay.report.kind = RestoreKind.STANDBY

    def _load_snapshot_if_faster(self, store: StorePartition) -> None:
        assert self._snapshots is not None
        partition = store.partition
        low, high = self._kafka.watermarks(store.changelog_topic, [partition], committed=True)[partition]
        loaded = load_snapshot_if_faster(store, self._snapshots(store.store), low, high)
        if loaded is not None:
            self.restorations.reports.append(loaded)

    def restart_damaged(self, error: StoreCorruptedError) -> None:
        """A store was found damaged while it restored: move it aside and restore it from scratch."""
        restoring = self.restorations.partitions.get(error.partition) if error.partition is not None else None
        damaged = damaged_store(restoring.stores if restoring else {}, error)
        if restoring is None or damaged is None:
            raise error
        self.restorations.reports.extend(suspend_started(restoring))
        aside = damaged.quarantine(error)
        log.warning(
            "Store %r partition %d was found damaged while restoring (%s); moved it to %s and restoring it fully",
            damaged.store,
            damaged.partition,
            error,
            aside,
        )
        self._report.stores_recovered += 1
        restoring.from_standby = False
        restoring.pending = self.replays(restoring)


def damaged_store(stores: dict[str, StorePartition], error: StoreCorruptedError) -> StorePartition | None:
    """The store among `stores` whose directory the corruption error names."""
    return next((store for store in stores.values() if str(store.path) == error.path), None)
