"""Partitions whose stores are being opened and restored while the worker keeps polling (Kafka
Streams' state updater, in the worker's own loop).

Owns `RestoringPartition` (an assigned source partition, paused, with its stores once their locks
are taken, and the changelog replays they still need) and `Restorations`, which the worker
advances one batch at a time between polls, so that restored partitions keep processing, the consumer keeps its group
membership during long restores, and a revocation or a stop interrupts a restore without losing
its progress. Messages of a restoring partition that arrive anyway are not processed: the
partition is rewound to the first of them when it resumes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dagster_stateful.core.monitoring.report import RestoreReport
from dagster_stateful.core.processing.restores.background import ChildReplay
from dagster_stateful.core.recovery.changelog_replay import ChangelogRestore
from dagster_stateful.core.state.partition import StorePartition


@dataclass
class RestoringPartition:
    partition: int
    committed: int | None
    """The group's committed offset; once the stores are open, the offset processing starts from."""
    assigned_at: float
    stores: dict[str, StorePartition] = field(default_factory=dict)
    stream_times: dict[str, int] = field(default_factory=dict)
    """The stream time of each window or TTL store that the group's last commit recorded."""
    opened: bool = False
    """Whether every store is open (their locks taken) and the replays they need are known."""
    pending: list[ChangelogRestore | ChildReplay] = field(default_factory=list)
    """The restores its stores still need, in this process or in children (`background_restores`)."""
    rewind_to: int | None = None
    """The first offset of this partition that arrived while it was restoring (not processed)."""
    from_standby: bool = False
    """Its stores were this worker's standby replicas until the assignment."""
    changelog_ends: dict[str, int] = field(default_factory=dict)
    """Per store, the changelog end the group's last commit recorded (`processing.commit_metadata`)."""
    bare_uncommitted: bool = False
    """That commit counts records without headers past those ends as uncommitted."""

    def note_arrival(self, offset: int) -> None:
        if self.rewind_to is None or offset < self.rewind_to:
            self.rewind_to = offset

    @property
    def records_left(self) -> int:
        return sum(replay.records_left for replay in self.pending)


class Restorations:
    """The restoring partitions of one worker, advanced one changelog batch per `step()`."""

    def __init__(self) -> None:
        self.partitions: dict[int, RestoringPartition] = {}
        self.reports: list[RestoreReport] = []
        """Every restore finished or suspended so far."""

    def __bool__(self) -> bool:
        return bool(self.partitions)

    def __contains__(self, partition: int) -> bool:
        return partition in self.partitions

    def add(self, restoring: RestoringPartition) -> None:
        self.partitions[restoring.partition] = restoring

    def unopened(self) -> list[RestoringPartition]:
        return [restoring for restoring in self.partitions.values() if not restoring.opened]

    def step(self) -> list[RestoringPartition]:
        """Look at the restores children run, advance this process's current restore by one batch
        (one at a time: they share the restore consumer), finish those done; returns the partitions
        now ready."""
        for restoring in self.partitions.values():
            for replay in restoring.pending:
                if isinstance(replay, ChildReplay):
                    replay.step()
            restoring.pending = [_here_if_handed_back(replay) for replay in restoring.pending]
        current = self._current_replay()
        if current is not None:
            current.step()
        for restoring in self.partitions.values():
            for replay in [replay for replay in restoring.pending if replay.done]:
                self.reports.append(replay.finish())
                restoring.pending.remove(replay)
        ready = [r for r in self.partitions.values() if r.opened and not r.pending]
        for restoring in ready:
            del self.partitions[restoring.partition]
        return ready

    def _current_replay(self) -> ChangelogRestore | None:
        """The restore this process runs: the one started, else the first waiting."""
        here = [r for p in self.partitions.values() for r in p.pending if isinstance(r, ChangelogRestore)]
        return next((replay for replay in here if replay.started), here[0] if here else None)

    @property
    def replaying_here(self) -> bool:
        """Whether this process has restores to run (not only children's to wait for)."""
        return self._current_replay() is not None

    def suspend(self, partition: int) -> RestoringPartition | None:
        """Stop restoring `partition` (its progress is kept); returns it so its stores can be closed."""
        restoring = self.partitions.pop(partition, None)
        if restoring is not None:
            self.reports.extend(suspend_started(restoring))
        return restoring

    @property
    def records_left(self) -> int:
        return sum(restoring.records_left for restoring in self.partitions.values())


def suspend_started(restoring: RestoringPartition) -> list[RestoreReport]:
    """Suspend the partition's restores that have started and forget them all; returns their reports."""
    reports = [replay.suspend() for replay in restoring.pending if replay.started]
    restoring.pending.clear()
    return reports


def _here_if_handed_back(replay: ChangelogRestore | ChildReplay) -> ChangelogRestore | ChildReplay:
    return replay.in_process if isinstance(replay, ChildReplay) and replay.handed_back else replay
