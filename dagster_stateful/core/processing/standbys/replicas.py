"""Standby replicas: warm copies of partitions that other members of the group own (Kafka Streams'
standby tasks), kept by a worker with `num_standby_replicas`.

Owns `StandbyReplicas`, which the worker advances once per loop, after its active work. Every
`refresh_seconds` it reads the group's description and keeps the partitions that
`standby_placement` gives this member, never one that its client (its host and state directory: its
worker pool) owns: it opens their store partitions in the state directory (the layout and locks of
active ones; a partition whose lock another holder keeps is left alone) and closes those it no
longer keeps. One batch per step, and one partition at a time, each kept store is brought to its
changelog's end by the restore every other path uses (`restorer.Restorer`): records of committed
messages only, by the same at-least-once rule, with the position checkpointed in the store; a
partition is tailed again once a commit interval has passed. A store an active opener waits for
(`StorePartition.handover_requested`, on a state directory shared with other members) is let go at
the next step. When the group gives this member a partition it keeps, `release()` hands the same
store over: its restore applies only the tail since the standby's position.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable

from confluent_kafka import Consumer, KafkaException, TopicPartition

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.bounded import BoundedCalls
from dagster_stateful.core.kafka.clients import RESTORE_CONSUMER_CONFIG, KafkaClients
from dagster_stateful.core.monitoring.listeners import Listeners
from dagster_stateful.core.processing.standbys.placement import group_standby_placement, standby_changes
from dagster_stateful.core.recovery.changelog_replay import ChangelogRestore
from dagster_stateful.core.recovery.restorer import Restorer
from dagster_stateful.core.state.commit_metadata import CommitMetadata, decode_commit_metadata
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.errors import StatefulError, StateLockedError, StateStoreError

log = logging.getLogger(__name__)

STANDBY_REFRESH_SECONDS = 5.0
"""How often a worker reads the group's membership to know which standbys it keeps."""
COMMITTED_TIMEOUT_SECONDS = 5.0


class StandbyReplicas:
    """The standby copies one worker keeps, and their changelog tails."""

    def __init__(
        self,
        config: AppConfig,
        kafka: KafkaClients,
        state: StateDirectory,
        member: Consumer,
        offset_reader: Consumer,
        refresh_seconds: float = STANDBY_REFRESH_SECONDS,
    ) -> None:
        """member: the worker's group consumer (its member id places the standbys). offset_reader:
        reads the group's committed offsets. The changelogs are read by a consumer of their own."""
        self._config = config
        self._kafka = kafka
        self._state = state
        self._member = member
        self._offset_reader = offset_reader
        self._consumer = kafka.consumer({"group.id": config.restore_group, **RESTORE_CONSUMER_CONFIG})
        self._restorer = Restorer(
            kafka, self._consumer, Listeners(), config.restore_batch_size, group=config.restore_group
        )
        self._refresh_seconds = refresh_seconds
        self._refresh_at = 0.0
        self.kept: dict[int, dict[str, StorePartition]] = {}
        """partition -> its open standby stores."""
        self.records_applied: dict[int, int] = {}
        """partition -> changelog records its standbys applied in this run (0 for each one kept)."""
        self.holders: dict[int, list[str]] = {}
        """partition -> the client ids of the members keeping its standbys, in failover order, as of
        the last stable membership this member read."""
        self._due: deque[tuple[int, str]] = deque()
        self._round_at = 0.0
        self._current: tuple[int, ChangelogRestore] | None = None

    def advance(self, held: set[int]) -> None:
        """One step after the worker's active work: follow the group's membership when due, let go of
        stores an active opener waits for, and apply at most one changelog batch."""
        now = time.monotonic()
        if now >= self._refresh_at:
            self._refresh_at = now + self._refresh_seconds
            self._follow_membership(held)
        self._hand_over_requested()
        self._step(now)

    @property
    def tailing(self) -> bool:
        """Whether a changelog tail is under way (the worker then polls without waiting)."""
        return self._current is not None

    def release(self, partition: int) -> bool:
        """The group gave this member `partition`: close its standby stores (their progress kept) so
        that the active path opens the same ones. True when it was kept here."""
        if partition not in self.kept:
            return False
        self._drop(partition)
        log.info("Partition %d becomes active here, where its standby was kept", partition)
        return True

    def summary(self) -> tuple[dict[int, int], dict[int, list[str]]]:
        """For the run's report: the records each standby applied, and who keeps each partition's standbys."""
        return dict(self.records_applied), {p: list(holders) for p, holders in self.holders.items()}

    def close(self, timeout: float) -> None:
        """Suspend the current tail, close the standby stores, then the changelog consumer (within `timeout`)."""
        for partition in list(self.kept):
            self._drop(partition)
        BoundedCalls("standby consumer").close("closing the standby consumer", self._consumer.close, timeout)

    # Which partitions to keep.

    def _follow_membership(self, held: set[int]) -> None:
        member = self._member.memberid()
        if not member:
            return
        try:
            group = self._kafka.describe_group(self._config.consumer_group, self._config.task_topic)
        except StatefulError as error:
            log.warning("Could not read group %r's membership for its standbys: %s", self._config.consumer_group, error)
            return
        assignment = {m.member_id: m.partitions for m in group.members}
        if group.state != "STABLE" or member not in assignment:
            return  # mid-rebalance the assignment is partial: keep the standbys until it settles
        placement = group_standby_placement(group.members, self._config.num_standby_replicas)
        client_ids = {m.member_id: m.client_id for m in group.members}
        self.holders = {p: [client_ids[h] for h in holders] for p, holders in placement.items()}
        changes = standby_changes(member, placement, assignment, held, self.kept)
        for partition in changes.drop:
            self._drop(partition)
            log.info("No longer keeps a standby of partition %d", partition)
        for partition in changes.keep:
            self._keep(partition)

    def _keep(self, partition: int) -> None:
        stores: dict[str, StorePartition] = {}
        try:
            for name in self._config.stores:
                store = self._state.partition(name, partition)
                if store.handover_requested:
                    raise StateLockedError(f"an active opener waits for {store.path}")
                store.open(lock_timeout=0, as_standby=True)
                stores[name] = store
        except (StateLockedError, StateStoreError) as error:
            _close_quietly(stores.values())
            log.debug("Keeps no standby of partition %d for now: %s", partition, error)
            return
        self.kept[partition] = stores
        self.records_applied.setdefault(partition, 0)
        self._due.extend((partition, name) for name in stores)
        log.info("Keeps a standby of partition %d (stores %s)", partition, sorted(stores))

    def _drop(self, partition: int) -> None:
        if self._current is not None and self._current[0] == partition:
            self._current[1].suspend()
            self._current = None
        self._due = deque(item for item in self._due if item[0] != partition)
        _close_quietly(self.kept.pop(partition).values())

    def _hand_over_requested(self) -> None:
        for partition, stores in list(self.kept.items()):
            if any(store.handover_requested for store in stores.values()):
                self._drop(partition)
                log.info("Let go of the standby of partition %d: its active owner opens it", partition)

    # Tailing the changelogs.

    def _step(self, now: float) -> None:
        """Apply one batch of the current tail; a standby that fails is dropped (it is only a copy:
        the next refresh keeps it again, and its active owner is not affected)."""
        try:
            self._apply_batch(now)
        except (StatefulError, KafkaException) as error:
            failed = self._current[0] if self._current is not None else self._due[0][0] if self._due else None
            self._abandon(failed)
            log.warning("Dropped the standby of partition %s after a failure: %s", failed, error)

    def _abandon(self, partition: int | None) -> None:
        current, self._current = self._current, None
        if current is not None:
            try:
                current[1].suspend()
            except (StatefulError, KafkaException) as error:
                log.debug("Suspending the failed standby restore also failed: %s", error)
        if partition in self.kept:
            self._drop(partition)

    def _apply_batch(self, now: float) -> None:
        if self._current is None:
            self._current = self._next_tail(now)
        if self._current is None:
            return
        partition, replay = self._current
        replay.step()
        if replay.done:
            report = replay.finish()
            self.records_applied[partition] = self.records_applied.get(partition, 0) + report.records_applied
            self._current = None

    def _next_tail(self, now: float) -> tuple[int, ChangelogRestore] | None:
        """The next kept store with records to apply; a new round starts once a commit interval has passed."""
        if not self._due and self.kept and now >= self._round_at:
            self._round_at = now + self._config.commit_interval
            self._due.extend((partition, name) for partition, stores in sorted(self.kept.items()) for name in stores)
        while self._due:
            partition, name = self._due[0]
            committed, metadata = self._committed(partition)
            end = metadata.changelog_ends.get(name)
            replay = self._restorer.begin(self.kept[partition][name], committed, end, metadata.bare_uncommitted)
            self._due.popleft()
            if replay is not None:
                replay.log_level, replay.batch_wait = logging.DEBUG, 0.0
                return partition, replay
        return None

    def _committed(self, partition: int) -> tuple[int | None, CommitMetadata]:
        """The group's committed offset (None: never committed) and what its commit recorded."""
        [committed] = self._offset_reader.committed(
            [TopicPartition(self._config.task_topic, partition)], timeout=COMMITTED_TIMEOUT_SECONDS
        )
        offset = committed.offset if committed.offset >= 0 else None
        where = f"{self._config.task_topic}[{partition}]"
        return offset, decode_commit_metadata(committed.metadata, offset, where)


def standbys_for(
    config: AppConfig,
    kafka: KafkaClients,
    state: StateDirectory,
    member: Consumer,
    offset_reader: Consumer,
    pinned: list[int] | None,
) -> StandbyReplicas | None:
    """The standbys of a worker of an app with `num_standby_replicas`; None for a run pinned to
    partitions (it has no group to place them by)."""
    if not config.num_standby_replicas or pinned is not None:
        return None
    return StandbyReplicas(config, kafka, state, member, offset_reader)


def _close_quietly(stores: Iterable[StorePartition]) -> None:
    for store in stores:
        try:
            store.close()
        except StateStoreError as error:
            log.warning("Closing the standby store %s failed: %s", store.path, error)
