"""What a worker does when Kafka gives it partitions, takes them back, or declares them lost.

Owns `PartitionAssignments`, the rebalance callbacks and the partitions they hand to the worker.
On assignment (inside the callback, quick work only): read the group's committed offsets, decide
where processing starts (`starting_offsets.StartingOffsets`) and take the partition paused;
between polls `store_opening.StoreOpener` opens its stores, wipes local state ahead of the
starting offset and starts the restores they need, which the worker runs between polls
(`state_updater.Restorations`); `activate()` resumes the partition. On revocation: commit, close
the partition's stores (or suspend their restore) before letting go. On loss (the group moved on
without us): drop uncommitted work and close. A re-keying app's source partitions keep no state:
they go to `rekeying.Rekeying` as they come and go, unpaused.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.kafka.error_codes import kafka_error_of
from dagster_stateful.core.monitoring.listeners import AppState, Listeners
from dagster_stateful.core.monitoring.report import WorkerReport
from dagster_stateful.core.processing.commit.changelog_positions import END_QUERY_SECONDS, bound_unknown_prefixes
from dagster_stateful.core.processing.paths.rekeying import Rekeying
from dagster_stateful.core.processing.restores.background import BackgroundRestores
from dagster_stateful.core.processing.restores.state_updater import Restorations, RestoringPartition
from dagster_stateful.core.processing.standbys.replicas import StandbyReplicas
from dagster_stateful.core.processing.worker.starting_offsets import StartingOffsets, reset_position
from dagster_stateful.core.processing.worker.store_opening import StoreOpener, damaged_store
from dagster_stateful.core.recovery.restorer import Restorer
from dagster_stateful.core.recovery.snapshot_format import SnapshotStore
from dagster_stateful.core.state.commit_metadata import decode_commit_metadata
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.participant import Partners
from dagster_stateful.core.state.session_state import SessionBounds
from dagster_stateful.core.state.transaction import PartitionTransaction
from dagster_stateful.core.state.window_state import WindowBounds
from dagster_stateful.errors import ConfigurationError, StateLockedError, StateStoreError, StoreCorruptedError

log = logging.getLogger(__name__)


class PartitionAssignments:
    def __init__(
        self,
        config: AppConfig,
        kafka: KafkaClients,
        state: StateDirectory,
        listeners: Listeners,
        restorer: Restorer | None,
        report: WorkerReport,
        commit: Callable[[], object],
        offset_reader: Consumer,
        cooperative: bool = True,
        snapshots: Callable[[str], SnapshotStore] | None = None,
        drop_in_flight: Callable[[], None] | None = None,
        live_stores: Mapping[str, WindowBounds | SessionBounds | None] | None = None,
        timer_store: str | None = None,
        background: BackgroundRestores | None = None,
        standbys: StandbyReplicas | None = None,
        rekeying: Rekeying | None = None,
        tables: Partners | None = None,
    ) -> None:
        """live_stores: the stores of aggregations, with their windows' bounds, and timer_store the
        store of the app's timers (see `PartitionTransaction`). snapshots: the snapshots of a store,
        when there are any: a restore loads the latest one when the planner says that is faster
        than replaying the changelog. drop_in_flight: called when partitions are lost, once they are closed
        (exactly-once: abort the open transaction, which holds their records, and rewind the
        partitions kept). background: runs full restores on the machine's other cores. standbys:
        the standby replicas this worker keeps; a partition assigned here takes over its store.
        rekeying: a re-keying app's source partitions (None: the app does not re-key). tables: the
        partitioned tables the steps join with, whose partitions follow the task partitions."""
        self.rekeying = rekeying
        self._tables = tables
        self._drop_in_flight = drop_in_flight
        self._standbys = standbys
        self._background = background
        self._live_stores = live_stores
        self._timer_store = timer_store
        self.config = config
        self._kafka = kafka
        self._state = state
        self._listeners = listeners
        self._starts = StartingOffsets(config, kafka, state, offset_reader)
        self._restorer = restorer
        self._report = report
        self._commit = commit
        self._cooperative = cooperative
        self._snapshots = snapshots
        self.transactions: dict[int, PartitionTransaction] = {}
        """Partitions ready to process."""
        self.restorations = Restorations()
        """Partitions whose stores are still restoring (paused)."""
        self.empty_since: float | None = None
        """Since when this worker has held no partition, once it joined the group (None after a loss,
        until the group assigns again)."""
        self.shutting_down = False
        """Set before the worker closes its consumer: the final revocation is not a rebalance."""
        self.dirty = False
        """Set when the worker must not commit any more (a failed delivery): revocation only closes."""
        self.failure: BaseException | None = None
        self._opener = StoreOpener(config, state, self._starts, self.restorations, report, restorer, kafka, snapshots)

    @property
    def held(self) -> set[int]:
        """The partitions of the state's topic held (restoring or ready)."""
        return set(self.transactions) | set(self.restorations.partitions)

    @property
    def holds_nothing(self) -> bool:
        return not self.held and not (self.rekeying is not None and self.rekeying.positions)

    # Taking partitions.

    def take(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Newly assigned partitions, with the offsets to assign them at; every one stays paused until
        `advance()` has opened its stores and restored them."""
        if not partitions:
            self._note_empty()
            return []
        self.empty_since = None
        self._listeners.transition(AppState.REBALANCING)
        self._report.rebalances += 1
        task_topic = self.config.task_topic
        upstream = [tp for tp in partitions if tp.topic != task_topic]
        partitions = [tp for tp in partitions if tp.topic == task_topic]
        starts = self._take_upstream(upstream)
        if not partitions:
            if not self.restorations:  # source partitions keep no state: nothing to restore first
                self._listeners.transition(AppState.RUNNING)
            return starts
        now = time.monotonic()
        reset = reset_position(self.config)
        for topic_partition in self._starts.committed(partitions):
            partition = topic_partition.partition
            committed = topic_partition.offset if topic_partition.offset >= 0 else None
            self._starts.check_source_offset(partition, committed)
            metadata = decode_commit_metadata(
                topic_partition.metadata, committed, f"{self.config.task_topic}[{partition}]"
            )
            warm = self._standbys is not None and self._standbys.release(partition)
            restoring = RestoringPartition(partition, committed, now, stream_times=metadata.stream_times)
            restoring.from_standby, restoring.changelog_ends = warm, metadata.changelog_ends
            restoring.bare_uncommitted = metadata.bare_uncommitted
            self.restorations.add(restoring)
            # Without a committed offset, assigned where `auto.offset.reset` says: librdkafka then starts
            # the partition's fetch at once, instead of after asking the group coordinator again.
            at = topic_partition.offset if committed is not None or reset is None else reset
            starts.append(TopicPartition(self.config.task_topic, partition, at))
        log.info("Assigned %s partitions %s", self.config.task_topic, sorted(tp.partition for tp in partitions))
        return starts

    def take_pinned(self, partitions: list[int], found: int) -> list[TopicPartition]:
        """A run pinned to `partitions` of the state's topic (which has `found` partitions), while no
        member of the group runs: where each starts, paused until its stores are restored."""
        config = self.config
        unknown = sorted(set(partitions) - set(range(found)))
        if unknown:
            raise ConfigurationError(
                f"{config.task_topic} has partitions 0..{found - 1}; there is no partition {unknown}"
            )
        group = self._kafka.describe_group(config.consumer_group, config.task_topic)
        if group.members:
            raise StateLockedError(
                f"consumer group {config.consumer_group!r} has {len(group.members)} active member(s) "
                f"({', '.join(sorted(set(group.owners().values())))}); a run pinned to partitions {partitions} "
                "must not compete with them. Wait until they stop (bounded runs end by themselves) and retry."
            )
        return self.take([TopicPartition(config.task_topic, p) for p in sorted(set(partitions))])

    def _take_upstream(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        if not partitions:
            return []
        if self.rekeying is None:
            raise StateStoreError(f"assigned partitions of {partitions[0].topic}, which this app does not read")
        return self.rekeying.take(self._starts.committed(partitions), reset_position(self.config))

    def advance(self, consumer: Consumer) -> None:
        """Between polls: open the stores of new partitions (waiting for locks without blocking),
        replay one changelog batch, and resume the partitions whose stores are up to date."""
        opening = self.restorations.unopened()
        for restoring in opening:
            self._opener.try_open(restoring)
        if self._background is not None and opening:
            self._background.launch(restoring.pending for restoring in self.restorations.partitions.values())
        try:
            ready = self.restorations.step()
        except StoreCorruptedError as damage:
            self._opener.restart_damaged(damage)
            return
        for restored in ready:
            self.activate(consumer, restored)

    def recover_corrupted(self, consumer: Consumer, partition: int, error: StoreCorruptedError) -> None:
        """A store was found damaged while processing `partition`: never the message's fault. Drop
        the partition's uncommitted work, move the damaged store aside, restore it from its
        changelog and process the partition again from its committed offset."""
        txn = self.transactions.get(partition)
        damaged = damaged_store(txn.stores if txn else {}, error)
        if txn is None or damaged is None:
            raise error
        del self.transactions[partition]
        aside = damaged.quarantine(error)
        start = txn.committed_offset
        if start is None:
            start = self._kafka.watermarks(self.config.task_topic, [partition])[partition][0]
        log.warning(
            "Store %r partition %d is damaged (%s); moved it to %s, restoring it from %s and processing "
            "%s[%d] again from offset %d",
            damaged.store,
            partition,
            error,
            aside,
            damaged.changelog_topic,
            self.config.task_topic,
            partition,
            start,
        )
        self._report.stores_recovered += 1
        consumer.pause([TopicPartition(self.config.task_topic, partition)])
        restoring = RestoringPartition(
            partition, txn.committed_offset, time.monotonic(), dict(txn.stores), txn.committed_stream_times
        )
        [committed] = self._starts.committed([TopicPartition(self.config.task_topic, partition)])
        metadata = decode_commit_metadata(
            committed.metadata, txn.committed_offset, f"{self.config.task_topic}[{partition}]"
        )
        restoring.changelog_ends, restoring.bare_uncommitted = metadata.changelog_ends, metadata.bare_uncommitted
        restoring.rewind_to = start
        self.restorations.add(restoring)

    def rewind(self, consumer: Consumer) -> None:
        """Drop every partition's uncommitted work and process it again from its committed offset."""
        for partition, txn in self.transactions.items():
            txn.roll_back()
            start = OFFSET_BEGINNING if txn.committed_offset is None else txn.committed_offset
            consumer.seek(TopicPartition(self.config.task_topic, partition, start))
        if self.rekeying is not None:
            self.rekeying.rewind(consumer)
        log.warning(
            "Dropped the uncommitted work of %s partitions %s; processing them again from their committed offsets",
            self.config.task_topic,
            sorted(self.transactions),
        )

    def activate(self, consumer: Consumer, restored: RestoringPartition) -> None:
        """A partition's stores are restored: process it from its starting offset."""
        self.transactions[restored.partition] = PartitionTransaction(
            restored.partition,
            restored.stores,
            self.config.state_serde,
            restored.committed,
            self._live_stores,
            self.config.store_ttls,
            restored.stream_times,
            timer_store=self._timer_store,
            exactly_once=self.config.exactly_once,
        )
        if self._tables is not None:
            txn = self.transactions[restored.partition]
            txn.participant = self._tables.open(restored.partition, dict(restored.stream_times))
        source, partition = self.config.task_topic, restored.partition
        query = self._kafka.time_left(END_QUERY_SECONDS, at_least=0.1)  # a bounded worker stays bounded
        bound_unknown_prefixes(
            restored.stores.values(), lambda: self._kafka.ends(source, [partition], query)[partition]
        )
        start = self._start_of(restored)
        if restored.committed is None and start is not None and start >= 0:
            self.transactions[restored.partition].next_offset = start  # caught up there, and committed there
        consumer.resume([TopicPartition(self.config.task_topic, restored.partition)])
        if start is not None:
            self._seek(consumer, restored, start)
        log.info("Partition %d is up to date; processing resumes", restored.partition)
        if not self.restorations:
            self._listeners.transition(AppState.RUNNING)

    def _seek(self, consumer: Consumer, restored: RestoringPartition, start: int) -> None:
        """Seek a resumed partition to `start`. After the resume: librdkafka fetches a resumed partition
        from its broker thread's next wake-up, up to a second later (bench/README.md); a seek starts
        the fetch at once. A partition without a committed offset was assigned at its reset position,
        where librdkafka starts it anyway: if its fetch has not started yet (`_STATE`), that is kept."""
        try:
            consumer.seek(TopicPartition(self.config.task_topic, restored.partition, start))
        except KafkaException as error:
            kafka_error = kafka_error_of(error)
            optional = restored.committed is None and restored.rewind_to is None
            if not (optional and kafka_error is not None and kafka_error.code() == KafkaError._STATE):
                raise
            log.debug(
                "%s[%d] starts where auto.offset.reset says: %s", self.config.task_topic, restored.partition, error
            )

    def _start_of(self, restored: RestoringPartition) -> int | None:
        """Where a restored partition's processing starts: its committed (or rewound) offset, else
        where `auto.offset.reset` says, the end read now (a position the lag check can count from)."""
        offsets = [o for o in (restored.committed, restored.rewind_to) if o is not None]
        if offsets:
            return min(offsets)
        start = reset_position(self.config)
        if start == OFFSET_END:
            marks = self._kafka.watermarks(
                self.config.task_topic, [restored.partition], committed=self.config.exactly_once
            )
            return marks[restored.partition][1]
        return start

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        starts = self.take(partitions)
        if not starts:
            return
        if self._cooperative:
            consumer.incremental_assign(starts)
        else:
            consumer.assign(starts)
        consumer.pause([tp for tp in starts if tp.topic == self.config.task_topic])

    # Letting partitions go.

    def _revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        task_topic = self.config.task_topic
        revoked = [tp.partition for tp in partitions if tp.topic == task_topic and tp.partition in self.held]
        upstream = self._held_upstream(partitions)
        if not revoked and not upstream:
            return
        if not self.shutting_down:
            self._listeners.transition(AppState.REBALANCING)
            self._report.rebalances += 1
        if not self.dirty:
            self._commit()
        if self.rekeying is not None:
            self.rekeying.release(upstream)
        self._close_partitions(revoked)
        self._note_empty()
        if revoked:
            log.info("Revoked %s partitions %s", self.config.task_topic, revoked)
        if self.transactions and not self.restorations and not self.shutting_down:
            self._listeners.transition(AppState.RUNNING)  # the partitions kept go on processing

    def _held_upstream(self, partitions: list[TopicPartition]) -> list[int]:
        rekeying = self.rekeying
        if rekeying is None:
            return []
        return [tp.partition for tp in partitions if tp.topic == rekeying.topic and tp.partition in rekeying.positions]

    def _lose(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        upstream = self._held_upstream(partitions)
        if self.rekeying is not None and upstream:
            log.warning("Lost %s partitions %s; the new owner processes them again", self.rekeying.topic, upstream)
            self.rekeying.release(upstream)
        task_topic = self.config.task_topic
        lost = [tp.partition for tp in partitions if tp.topic == task_topic and tp.partition in self.held]
        if lost:
            log.warning(
                "Lost %s partitions %s (the group moved on without this worker); their uncommitted work "
                "is dropped and will be processed again by the new owner",
                self.config.task_topic,
                lost,
            )
            self._report.rebalances += 1
            self._report.partitions_lost += len(lost)
        try:
            self._close_partitions(lost)
        finally:
            if (lost or upstream) and self._drop_in_flight is not None:
                self._drop_in_flight()
        # Holding nothing now says nothing about the group: the idle clock starts again only once
        # the group has answered this worker's rejoin with an assignment (empty or not).
        self.empty_since = None

    def close_all(self) -> None:
        if self._background is not None:
            self._background.close()
        if self.rekeying is not None:
            self.rekeying.release(list(self.rekeying.positions))
        self._close_partitions(list(self.held))

    def _close_partitions(self, partitions: list[int]) -> None:
        """Close the partitions' stores, all of them even when some fail; raises the first failure."""
        failures: list[StateStoreError] = []
        for partition in partitions:
            failures.extend(self._close(partition))
        for failure in failures[1:]:
            log.error("Closing a store also failed: %s", failure)
        if failures:
            raise failures[0]

    def _close(self, partition: int) -> list[StateStoreError]:
        """Close the partition's stores (each releases its lock even when closing fails); returns the failures."""
        txn = self.transactions.pop(partition, None)
        if self._tables is not None:
            self._tables.close(partition)
        restoring = self.restorations.suspend(partition)
        stores = txn.stores if txn is not None else restoring.stores if restoring is not None else {}
        failures = []
        for store in stores.values():
            try:
                store.close()
            except StateStoreError as error:
                failures.append(error)
        return failures

    def _note_empty(self) -> None:
        if self.holds_nothing and self.empty_since is None:
            self.empty_since = time.monotonic()

    # confluent-kafka's propagation of an exception out of a rebalance callback is unreliable (it can
    # surface as a bare KafkaError, which is no exception), so failures are kept and re-raised by
    # `raise_failure` once `consume()` has returned.

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._guarded(self._on_assign, consumer, partitions)

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._guarded(self._revoke, consumer, partitions)

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._guarded(self._lose, consumer, partitions)

    def _guarded(
        self,
        handler: Callable[[Consumer, list[TopicPartition]], None],
        consumer: Consumer,
        partitions: list[TopicPartition],
    ) -> None:
        if self.failure is not None:
            return
        try:
            handler(consumer, partitions)
        except BaseException as error:  # noqa: BLE001 - re-raised by raise_failure
            self.failure = error

    def raise_failure(self) -> None:
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure
