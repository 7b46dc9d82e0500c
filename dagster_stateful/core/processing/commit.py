"""The one place a commit happens, in the order that makes a crash at any point lose nothing.

Owns `Committer` and `DeliveryTracker`. A commit of a set of partition transactions:
1. produces each changed key to the store's changelog (value, or a tombstone for a delete) with
   the processed source offset in a header (outputs were produced while processing);
2. waits until Kafka acknowledged every changelog and output record (a failure stops here:
   nothing is committed, and the messages will be processed again);
3. commits the source offsets;
4. writes each store partition's changes with both offsets in one RocksDB WriteBatch, then its
   `.checkpoint` file.
Exactly-once will wrap steps 1-3 in a Kafka transaction (`_deliver_and_commit_offsets`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

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
}


class CommitDeferred(Exception):
    """The group is rebalancing (or moved on): the source commit was refused, nothing else was written.

    The transactions keep their changes and the next commit retries; changelog records already
    sent carry processed offsets at or past the committed offset, so a restore skips them.
    """


class DeliveryTracker:
    """The producer's delivery callback: remembers failures and the last offset per topic partition."""

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

    def commit(self, transactions: Iterable[PartitionTransaction]) -> dict[int, int]:
        """Commit every transaction with progress; returns the committed offset per partition."""
        pending = [txn for txn in transactions if txn.has_progress]
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

    def _deliver_and_commit_offsets(self, offsets: list[TopicPartition]) -> None:
        remaining = self._producer.flush(FLUSH_TIMEOUT)
        if remaining or self._tracker.errors:
            errors, self._tracker.errors = self._tracker.errors, []
            raise DeliveryError(
                f"Kafka did not acknowledge {remaining} records within {FLUSH_TIMEOUT:.0f} s"
                f"{' and rejected: ' + '; '.join(errors[:5]) if errors else ''}. Nothing was committed for "
                f"{self._source_topic} partitions {[tp.partition for tp in offsets]}: those messages will be "
                "processed again. Check the brokers and the topics' min.insync.replicas."
            )
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as error:
            code = error.args[0].code() if error.args and isinstance(error.args[0], KafkaError) else None
            if code not in _RETRIABLE_COMMIT_ERRORS:
                raise
            raise CommitDeferred(str(error.args[0])) from error
