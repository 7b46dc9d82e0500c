"""What a worker does when Kafka gives it partitions, takes them back, or declares them lost.

Owns `PartitionAssignments`, the rebalance callbacks. On assignment, before the partition's first
message: read the group's committed offset, refuse a committed offset below the source's low
watermark (with the operator's options), open each store partition, wipe local state that is
ahead of the committed offset (it holds effects of messages that will be processed again), and
restore from the changelog. On revocation: commit, then close the partition's stores before
letting go. On loss (the group moved on without us): drop uncommitted work and close.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException, TopicPartition

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.monitoring.listeners import AppState, Listeners
from dagster_stateful.core.monitoring.report import WorkerReport
from dagster_stateful.core.recovery.changelog import Restorer
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.transaction import PartitionTransaction
from dagster_stateful.errors import RecoveryError

log = logging.getLogger(__name__)

COMMITTED_ATTEMPTS = 3
COMMITTED_TIMEOUT = 15.0


class PartitionAssignments:
    def __init__(
        self,
        config: AppConfig,
        state: StateDirectory,
        listeners: Listeners,
        restorer: Restorer | None,
        report: WorkerReport,
        commit: Callable[[], None],
        offset_reader: Consumer,
    ) -> None:
        self.config = config
        self._state = state
        self._listeners = listeners
        self._offset_reader = offset_reader
        self._restorer = restorer
        self._report = report
        self._commit = commit
        self.transactions: dict[int, PartitionTransaction] = {}
        self.empty_since: float | None = None
        """Since when this worker has held no partition, once it joined the group."""
        self.shutting_down = False
        self.failure: BaseException | None = None
        """Set before the worker closes its consumer: the final revocation is not a rebalance."""

    def _assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if not partitions:
            self._note_empty()
            return
        self.empty_since = None
        self._listeners.transition(AppState.REBALANCING)
        self._report.rebalances += 1
        committed = self._committed_offsets(partitions)
        for topic_partition in committed:
            offset = topic_partition.offset if topic_partition.offset >= 0 else None
            self._check_source_offset(consumer, topic_partition.partition, offset)
            self.transactions[topic_partition.partition] = self._open(topic_partition.partition, offset)
        log.info("Assigned %s partitions %s", self.config.source, sorted(tp.partition for tp in partitions))
        self._listeners.transition(AppState.RUNNING)

    def _revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        revoked = [tp.partition for tp in partitions if tp.partition in self.transactions]
        if not revoked:
            return
        if not self.shutting_down:
            self._listeners.transition(AppState.REBALANCING)
            self._report.rebalances += 1
        self._commit()
        for partition in revoked:
            self._close(partition)
        self._note_empty()
        log.info("Revoked %s partitions %s", self.config.source, revoked)

    def _lose(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        lost = [tp.partition for tp in partitions if tp.partition in self.transactions]
        if lost:
            log.warning(
                "Lost %s partitions %s (the group moved on without this worker); their uncommitted work "
                "is dropped and will be processed again by the new owner",
                self.config.source,
                lost,
            )
            self._report.rebalances += 1
        for partition in lost:
            self._close(partition)
        self._note_empty()

    def _note_empty(self) -> None:
        if not self.transactions and self.empty_since is None:
            self.empty_since = time.monotonic()

    # confluent-kafka's propagation of an exception out of a rebalance callback is unreliable (it can
    # surface as a bare KafkaError, which is no exception), so failures are kept and re-raised by
    # `raise_failure` once `consume()` has returned.

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._guarded(self._assign, consumer, partitions)

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

    def close_all(self) -> None:
        for partition in list(self.transactions):
            self._close(partition)

    def _committed_offsets(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        # Not the subscribed consumer: its committed() can stall until timeout inside a cooperative
        # rebalance callback. A second consumer of the group that never joins it reads the same offsets.
        for attempt in range(1, COMMITTED_ATTEMPTS + 1):
            try:
                return self._offset_reader.committed(partitions, timeout=COMMITTED_TIMEOUT)
            except KafkaException as error:
                if attempt == COMMITTED_ATTEMPTS:
                    raise RecoveryError(
                        f"could not read group {self.config.consumer_group!r}'s committed offsets for "
                        f"{self.config.source} partitions {[tp.partition for tp in partitions]} after {attempt} "
                        f"attempts ({error}); is the group coordinator reachable?"
                    ) from error
                log.warning("Reading committed offsets failed (%s); retrying", error)
        raise AssertionError("unreachable")

    def _open(self, partition: int, committed: int | None) -> PartitionTransaction:
        stores: dict[str, StorePartition] = {}
        try:
            for name in self.config.stores:
                store = self._state.partition(name, partition)
                store.open()
                stores[name] = store
                if store.source_offset is not None and store.source_offset > (committed or 0):
                    log.warning(
                        "Store %r partition %d holds state up to source offset %d but the group's committed "
                        "offset is %s (offsets were reset?); rebuilding it from the changelog",
                        name,
                        partition,
                        store.source_offset,
                        committed,
                    )
                    store.wipe()
                    store.open()
                if self._restorer is not None:
                    restored = self._restorer.restore(store, committed)
                    if restored is not None:
                        self._report.restores.append(restored)
        except BaseException:
            for store in stores.values():
                store.close()
            raise
        return PartitionTransaction(partition, stores, self.config.state_serde, committed)

    def _close(self, partition: int) -> None:
        txn = self.transactions.pop(partition, None)
        if txn is not None:
            for store in txn.stores.values():
                store.close()

    def _check_source_offset(self, consumer: Consumer, partition: int, committed: int | None) -> None:
        if committed is None:
            return
        low, _ = consumer.get_watermark_offsets(TopicPartition(self.config.source, partition), timeout=30, cached=False)
        if committed < low:
            raise RecoveryError(
                f"group {self.config.consumer_group!r} committed offset {committed} on "
                f"{self.config.source}[{partition}], "
                f"below the topic's low watermark {low}: messages {committed}..{low - 1} were deleted (retention) "
                "before they were processed. Options: accept the gap and move the group to the low watermark "
                f"(`kafka-consumer-groups --reset-offsets --to-earliest --group {self.config.consumer_group} "
                f"--topic {self.config.source}:{partition} --execute`), or reprocess from a source that still holds "
                "them."
            )
