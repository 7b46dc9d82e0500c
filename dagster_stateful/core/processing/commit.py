"""The one place a commit happens, in the order that makes a crash at any point lose nothing.

Owns `Committer` and `DeliveryTracker`. A commit of a set of partition transactions:
1. produces each changed key to the store's changelog (value, or a tombstone for a delete) with
   the processed source offset in a header (outputs were produced while processing);
2. waits until Kafka acknowledged every changelog and output record (a failure stops here:
   nothing is committed, and the messages will be processed again);
3. commits the source offsets;
4. writes each store partition's changes with both offsets in one RocksDB WriteBatch, then its
   `.checkpoint` file.
A delivery failure is sticky for the run: a record Kafka rejected (changelog or output) is lost
for good, so once one failed, or one was not acknowledged in time, every later commit raises
`DeliveryError` again and commits nothing; the worker must close without committing
(`Committer.failed`) and the next run processes those messages again.
Exactly-once will wrap steps 1-3 in a Kafka transaction (`_deliver_and_commit_offsets`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import NoReturn

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from dagster_stateful.core.kafka.records import position
from dagster_stateful.core.recovery.changelog import source_offset_header
from dagster_stateful.core.state.transaction import Change, PartitionTransaction
from dagster_stateful.errors import DeliveryError

log = logging.getLogger(__name__)

FLUSH_TIMEOUT = 60.0
_RETRIABLE_COMMIT_ERRORS = {
    KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError._ASSIGNMENT_LOST,
    # The coordinator is away (a broker outage, a moving coordinator): the next commit retries.
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError._TIMED_OUT,
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._WAIT_COORD,
}


class CommitDeferred(Exception):
    """The group is rebalancing (or moved on), or its coordinator is unreachable: the source commit
    did not happen and nothing else was written.

    The transactions keep their changes and the next commit retries; changelog records already
    sent carry processed offsets at or past the committed offset, so a restore treats them as
    records of uncommitted messages (see `recovery.uncommitted`).
    """


class DeliveryTracker:
    """The producer's delivery callback: remembers failures (every one, for the run) and the last
    offset per topic partition."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.last_offsets: dict[tuple[str, int], int] = {}

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.errors.append(f"{message.topic()}[{message.partition()}]: {error.str()}")
            return
        topic, partition, offset = position(message)
        if offset > self.last_offsets.get((topic, partition), -1):
            self.last_offsets[(topic, partition)] = offset

    def next_offset(self, topic: str, partition: int) -> int | None:
        last = self.last_offsets.get((topic, partition))
        return None if last is None else last + 1


class Committer:
    def __init__(
        self,
        consumer: Consumer,
        producer: Producer,
        tracker: DeliveryTracker,
        source_topic: str,
        changelog_topics: dict[str, str] | None,
    ) -> None:
        self._consumer = consumer
        self._producer = producer
        self._tracker = tracker
        self._source_topic = source_topic
        self._changelog_topics = changelog_topics
        """Changelog topic per store; None when changelogs are off."""
        self._failure: DeliveryError | None = None

    @property
    def failed(self) -> bool:
        """True once a record was rejected or not acknowledged: nothing may be committed any more."""
        return self._failure is not None or bool(self._tracker.errors)

    @property
    def failure(self) -> DeliveryError | None:
        """The first delivery failure of the run (None while there is none)."""
        return self._failure

    def commit(self, transactions: Iterable[PartitionTransaction]) -> dict[int, int]:
        """Commit every transaction with progress; returns the committed offset per partition.

        Raises `DeliveryError`, writing nothing, when this or any earlier delivery failed."""
        pending = [txn for txn in transactions if txn.has_progress]
        self._refuse_after_failure([txn.partition for txn in pending])
        if not pending:
            return {}
        prepared = {txn.partition: {store: list(txn.changes(store)) for store in txn.stores} for txn in pending}
        if self._changelog_topics is not None:
            for txn in pending:
                self._produce_changelog(txn.partition, prepared[txn.partition])
        offsets = [TopicPartition(self._source_topic, txn.partition, txn.offset_to_commit) for txn in pending]
        try:
            self._deliver_and_commit_offsets(offsets)
        except CommitDeferred as deferred:
            log.info(
                "Commit of %s partitions %s deferred: %s",
                self._source_topic,
                [tp.partition for tp in offsets],
                deferred,
            )
            return {}
        for txn in pending:
            for store, changes in prepared[txn.partition].items():
                changelog_offset = (
                    self._tracker.next_offset(self._changelog_topics[store], txn.partition)
                    if self._changelog_topics is not None and changes
                    else None
                )
                txn.stores[store].commit(
                    ((key, value) for key, value, _ in changes), changelog_offset, txn.offset_to_commit
                )
            txn.committed()
        return {txn.partition: txn.offset_to_commit for txn in pending}

    def _produce_changelog(self, partition: int, changes_by_store: dict[str, list[Change]]) -> None:
        assert self._changelog_topics is not None
        for store, changes in changes_by_store.items():
            topic = self._changelog_topics[store]
            for key, value, source_offset in changes:
                self._produce(topic, key, value, partition, source_offset)

    def _produce(self, topic: str, key: bytes, value: bytes | None, partition: int, source_offset: int) -> None:
        while True:
            try:
                self._producer.produce(
                    topic, key=key, value=value, partition=partition, headers=source_offset_header(source_offset)
                )
                return
            except BufferError:
                self._producer.poll(0.1)

    def _refuse_after_failure(self, partitions: list[int]) -> None:
        """Raise again when an earlier commit failed, or a delivery report since brought a failure."""
        if self._failure is not None:
            raise DeliveryError(
                f"a delivery failed earlier in this run, so nothing more is committed for {self._source_topic} "
                f"partitions {partitions}: close without committing and run again; the uncommitted messages will "
                f"be processed again. The first failure: {self._failure}"
            ) from self._failure
        if self._tracker.errors:
            self._fail(0, partitions)

    def _fail(self, unacknowledged: int, partitions: list[int]) -> NoReturn:
        errors = self._tracker.errors
        problems = (
            [f"did not acknowledge {unacknowledged} records within {FLUSH_TIMEOUT:.0f} s"] if unacknowledged else []
        )
        if errors:
            problems.append(f"rejected {len(errors)} records ({'; '.join(errors[:5])})")
        self._failure = DeliveryError(
            f"Kafka {' and '.join(problems)}. Nothing was committed for "
            f"{self._source_topic} partitions {partitions}, nor will be in this run: those messages will be "
            "processed again by the next run. Check the brokers, the topics' min.insync.replicas and "
            "max.message.bytes."
        )
        raise self._failure

    def _deliver_and_commit_offsets(self, offsets: list[TopicPartition]) -> None:
        remaining = self._producer.flush(FLUSH_TIMEOUT)
        if remaining or self._tracker.errors:
            self._fail(remaining, [tp.partition for tp in offsets])
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as error:
            kafka_error = error.args[0] if error.args and isinstance(error.args[0], KafkaError) else None
            if kafka_error is None or kafka_error.code() not in _RETRIABLE_COMMIT_ERRORS:
                raise
            raise CommitDeferred(kafka_error.str()) from error
