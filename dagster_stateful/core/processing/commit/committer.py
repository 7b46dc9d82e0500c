"""The one place a commit happens, in the order that makes a crash at any point lose nothing.

Owns `Committer` (deliveries are tracked by `delivery.DeliveryTracker`). A commit of a set of
partition transactions (after their expiring and bounded stores deleted what has expired or
would not fit, which the commit then carries like any change):
1. produces each changed key to the store's changelog (value, or a tombstone for a delete): under
   exactly-once with the processed source offset in a header, at-least-once as one block per store
   partition (`recovery.changelog_format`), with the values of the keys a restore asked to write
   again (outputs were produced while processing);
2. waits until Kafka acknowledged every changelog and output record (a failure stops here:
   nothing is committed, and the messages will be processed again);
3. commits the source offsets, with the stream time of each store that keeps one in the commit's
   metadata (`commit_metadata`) and, at-least-once, where each store's changelog ends when every
   record below is known to be committed (`changelog_positions`);
4. writes each store partition's changes with both offsets in one RocksDB WriteBatch, then its
   `.checkpoint` file (a store found damaged here is reported by `StoresDamaged` once every other
   partition is written: its commit is in the changelog, so it is restored, not lost).
Every record of the run (outputs and dead letters while processing, changelog records at commit)
is produced through `Committer.produce`. The committer also gathers the run's store metrics
(`Committer.metrics`): the counters of every store partition a commit sees, and how long each
commit that went through took.

At-least-once: a delivery failure is sticky for the run: a record Kafka rejected (changelog or
output) is lost for good, so once one failed, or one was not acknowledged in time, every later
commit raises `DeliveryError` again and commits nothing; the worker must close without committing
(`Committer.failed`) and the next run processes those messages again. A record refused for want of
an ACL (Write on its topic) raises `KafkaAuthorizationError` instead, naming the topic.

Exactly-once (Kafka Streams' exactly_once_v2): steps 1-3 are one Kafka transaction
(`transactions.KafkaTransactions`), opened by the first record after a commit; the source offsets
join it with the consumer's group metadata and it commits atomically. A transaction Kafka aborts
raises `TransactionAborted` (nothing was written; the caller rewinds), a fenced producer raises
`ProducerFencedError`. RocksDB is written only after the transaction committed. Closing
(`Committer.close`) aborts what is left open; at-least-once, it delivers what is left.

A bounded worker's commit gives up at its deadline (`lifecycle.Deadline`): every wait (a full
producer queue, the acknowledgements, the transaction's calls) ends there, the calls that ignore
their timeout run bounded (`kafka.bounded.BoundedCalls`), and the commit raises
`CommitTimeoutError` naming the partitions and offsets it did not commit; like a delivery failure,
it is sticky for the run. So is an abort that ran out of time while a record was produced. The
at-least-once source commit is the exception: confluent-kafka's synchronous commit takes no
timeout, and made from another thread (while the worker's, which serves the rebalance callbacks,
waits) it stalled cooperative rebalances for minutes, so it runs on the worker's thread, after
acknowledgements that are bounded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from itertools import islice
from typing import NoReturn

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from dagster_stateful.core.kafka.bounded import CallTimedOut
from dagster_stateful.core.kafka.records import Headers
from dagster_stateful.core.kafka.security.acl_model import AclRequirement, Operation, ResourceType
from dagster_stateful.core.kafka.security.authorization import authorization_error, is_authorization_failure
from dagster_stateful.core.processing.commit.changelog_positions import ChangelogEnds, ChangelogPositions, Prepared
from dagster_stateful.core.processing.commit.delivery import DEFAULT_DELIVERY_TIMEOUT_MS, DeliveryTracker
from dagster_stateful.core.processing.commit.source_commit import CommitDeferred, SourceCommit
from dagster_stateful.core.processing.commit.transactions import KafkaTransactions, TransactionAborted
from dagster_stateful.core.processing.lifecycle import Deadline
from dagster_stateful.core.recovery.changelog_format import block_headers, source_offset_header
from dagster_stateful.core.state.metrics import RunStoreMetrics
from dagster_stateful.core.state.transaction import Change, PartitionTransaction
from dagster_stateful.errors import CommitTimeoutError, DeliveryError, StatefulError, StoreCorruptedError

log = logging.getLogger(__name__)

UNASSIGNED_PARTITION = -1
"""librdkafka's RD_KAFKA_PARTITION_UA: the producer's partitioner chooses (by the key's hash)."""
FLUSH_MARGIN_SECONDS = 5.0
"""A commit waits this much longer than the delivery timeout, for the producer's own verdict."""


class StoresDamaged(Exception):
    """The source offsets were committed, but writing some partitions' local stores found them
    damaged (RocksDB reported corruption). Their commits are in the changelog: each damaged store
    must be moved aside and restored, then its partition processed from the new committed offset."""

    def __init__(self, errors: dict[int, StoreCorruptedError], committed: dict[int, int]) -> None:
        super().__init__(f"damaged stores in partitions {sorted(errors)}")
        self.errors = errors
        """The corruption met, per source partition."""
        self.committed = committed
        """The committed offset per partition, as `Committer.commit` returns it."""


class Committer:
    def __init__(
        self,
        consumer: Consumer,
        producer: Producer,
        tracker: DeliveryTracker,
        source_topic: str,
        changelog_topics: dict[str, str] | None,
        delivery_timeout_seconds: float = DEFAULT_DELIVERY_TIMEOUT_MS / 1000,
        transactions: KafkaTransactions | None = None,
        deadline: Deadline | None = None,
        group: str | None = None,
        changelog_ends: ChangelogEnds | None = None,
    ) -> None:
        """delivery_timeout_seconds: the producer's `delivery.timeout.ms`, in seconds (see
        `delivery_timeout_seconds`); a commit waits that long, plus a margin, for acknowledgements.
        transactions: the producer's transactions, under exactly-once (None: at-least-once).
        deadline: when a commit gives up (a bounded worker's; None: none). group: the consumer's group,
        named when Kafka refuses its commit (None: not known). changelog_ends: asks the broker where
        changelog partitions end (`KafkaClients.ends`), for a producer that reports errors only
        (None: stores keep their changelog offset unless deliveries were reported)."""
        self._consumer = consumer
        self._group = group
        self._deadline = deadline or Deadline(None)
        self._committing: list[PartitionTransaction] = []
        """The transactions of the commit under way (empty between commits)."""
        self.transactions = transactions
        self._delivery_timeout = delivery_timeout_seconds
        self._producer = producer
        self._tracker = tracker
        self._source_topic = source_topic
        self._changelog_topics = changelog_topics
        """Changelog topic per store; None when changelogs are off."""
        self._failure: StatefulError | None = None
        self._positions = ChangelogPositions(tracker, changelog_topics, changelog_ends, self._deadline)
        self._source = SourceCommit(consumer, source_topic, group)
        self._upstream: list[TopicPartition] = []
        """The upstream offsets of the commit under way."""
        self.committed_upstream: list[TopicPartition] = []
        """The upstream offsets the last commit committed (empty when it committed none)."""
        self.metrics = RunStoreMetrics()
        """The run's store metrics: `metrics.summary()` once its stores are closed."""

    @property
    def failed(self) -> bool:
        """True once a record was rejected or not acknowledged: nothing may be committed any more
        (at-least-once; under exactly-once the transaction holding such a record aborts instead)."""
        return self._failure is not None or (self.transactions is None and bool(self._tracker.errors))

    @property
    def failure(self) -> StatefulError | None:
        """The first delivery failure of the run (None while there is none)."""
        return self._failure

    def commit(
        self, transactions: Iterable[PartitionTransaction], upstream: list[TopicPartition] | None = None
    ) -> dict[int, int]:
        """Commit every transaction with progress, or with expired windows or entries to delete, and
        the `upstream` offsets (a re-keying app's source partitions, which keep no state, committed
        in the same transaction or after the same acknowledgements); returns the committed offset
        per partition of the state's topic.

        Raises `DeliveryError`, writing nothing, when this or any earlier delivery failed."""
        started = time.perf_counter()
        held = list(transactions)
        self._track_metrics(held)
        pending = [txn for txn in held if txn.has_progress or txn.expiries_due]
        self._refuse_after_failure([txn.partition for txn in pending])
        self._upstream, self.committed_upstream = upstream or [], []
        records_only = self.transactions is not None and self.transactions.open
        if not pending and not self._upstream and not records_only:
            return {}
        for txn in pending:
            txn.prepare_commit()
        prepared = {txn.partition: {store: txn.changes(store) for store in txn.stores} for txn in pending}
        self._committing = pending
        try:
            if self._changelog_topics is not None:
                for txn in pending:
                    self._produce_changelog(txn, prepared[txn.partition])
            ends = self._deliver_and_commit_offsets(pending, prepared)
            self.committed_upstream = self._upstream
        except CallTimedOut as timed_out:
            raise self.timed_out(timed_out) from timed_out
        except CommitDeferred as deferred:
            log.info(
                "Commit of %s partitions %s deferred: %s",
                self._source_topic,
                [txn.partition for txn in pending],
                deferred,
            )
            return {}
        finally:
            self._committing = []
        damaged: dict[int, StoreCorruptedError] = {}
        for txn in pending:
            try:
                self._write_stores(txn, prepared[txn.partition], ends)
            except StoreCorruptedError as error:
                damaged[txn.partition] = error
            txn.committed()
        committed = {txn.partition: txn.offset_to_commit for txn in pending}
        self.metrics.commit_latency.record(time.perf_counter() - started)
        if damaged:
            raise StoresDamaged(damaged, committed)
        return committed

    def close(self, seconds: float) -> None:
        """Let the producer go within `seconds`: under exactly-once abort what is left open (every
        committed record was flushed by its commit; a fenced producer must not flush), else deliver
        what is left. A failure is only logged (the run met it first)."""
        if self.transactions is not None:
            self.transactions.abort_quietly(seconds)
            return
        try:
            self._producer.flush(seconds)
        except KafkaException as error:
            log.warning("Flushing the producer of the worker on %s while closing failed: %s", self._source_topic, error)

    def _track_metrics(self, transactions: list[PartitionTransaction]) -> None:
        for txn in transactions:
            for store, partition in txn.stores.items():
                self.metrics.track(store, txn.partition, partition.metrics)

    def _offsets(
        self, pending: list[PartitionTransaction], positions: dict[tuple[str, int], int]
    ) -> list[TopicPartition]:
        """The source offsets to commit, with their metadata (at-least-once: the committed changelog ends)."""
        offsets = []
        for txn in pending:
            ends = self._positions.committed_ends(txn, positions) if self.transactions is None else {}
            metadata = self._source.metadata.encode(txn.stream_times_to_commit(), txn.offset_to_commit, ends)
            offsets.append(TopicPartition(self._source_topic, txn.partition, txn.offset_to_commit, metadata))
        return offsets + self._upstream

    def _write_stores(
        self, txn: PartitionTransaction, changes_by_store: dict[str, list[Change]], ends: dict[tuple[str, int], int]
    ) -> None:
        for store, changes in changes_by_store.items():
            txn.stores[store].commit(
                ((key, value) for key, value, _ in changes), ends.get((store, txn.partition)), txn.offset_to_commit
            )

    def _produce_changelog(self, txn: PartitionTransaction, changes_by_store: dict[str, list[Change]]) -> None:
        """One changelog record per change (1M for a commit of 1M keys), handed to librdkafka in this
        loop; a full queue or a refusal goes through `produce`, which waits or raises it clearly."""
        assert self._changelog_topics is not None
        partition = txn.partition
        if self.transactions is not None:
            self.transactions.begin()
        else:
            self._positions.produced(txn, changes_by_store)
        send = self._producer.produce
        for store, changes in changes_by_store.items():
            topic = self._changelog_topics[store]
            if self.transactions is None:
                self._produce_block(topic, partition, changes, txn.first_offset, txn.offset_to_commit)
                continue
            for key, value, source_offset in changes:
                headers = source_offset_header(source_offset)
                try:
                    send(topic, value, key, partition, None, None, 0, headers)
                except (BufferError, KafkaException):
                    self.produce(topic, key, value, headers, partition)

    def _produce_block(
        self, topic: str, partition: int, changes: list[Change], first_offset: int, offset_to_commit: int
    ) -> None:
        """The changes as one block (`changelog_format`): headers on the first record only."""
        if not changes:
            return
        key, value, _ = changes[0]
        self.produce(topic, key, value, block_headers(first_offset, offset_to_commit, len(changes)), partition)
        send = self._producer.produce
        for key, value, _ in islice(changes, 1, None):
            try:
                send(topic, value, key, partition)
            except (BufferError, KafkaException):
                self.produce(topic, key, value, None, partition)

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp: int = 0,
    ) -> None:
        """Produce one record that the next commit depends on (inside the open transaction under
        exactly-once); a full producer queue is waited out, serving delivery reports. An abort that
        runs out of time (a record was refused, and Kafka does not answer) raises `CommitTimeoutError`.
        timestamp: the record's, in ms (0: now)."""
        target = UNASSIGNED_PARTITION if partition is None else partition
        try:
            if self.transactions is not None:
                self.transactions.begin()
            while True:
                try:
                    # Positional: confluent-kafka parses keyword arguments at about 1.5 µs per call.
                    self._producer.produce(topic, value, key, target, None, None, timestamp, headers)
                    return
                except BufferError:
                    self._wait_for_room(topic)
                except KafkaException as error:
                    self._raise_produce_failure(error, topic)
        except CallTimedOut as timed_out:
            raise self.timed_out(timed_out) from timed_out

    def _raise_produce_failure(self, error: KafkaException, topic: str) -> NoReturn:
        if self.transactions is not None:
            self.transactions.raise_if_fenced(f"producing a record to {topic}", error)
            self.transactions.raise_if_aborting(f"producing a record to {topic}", error)
        self._raise_refusal(error, topic)
        raise error

    def _raise_refusal(self, error: KafkaException, topic: str) -> None:
        """When the producer failed fatally because Kafka refused an ACL (an idempotent producer's
        IdempotentWrite), raise that refusal: `produce` says only _FATAL, the next poll raises the cause."""
        kafka_error = error.args[0] if error.args and isinstance(error.args[0], KafkaError) else None
        if kafka_error is None or kafka_error.code() != KafkaError._FATAL:
            return
        try:
            self._producer.poll(0)
        except (KafkaException, SystemError) as raised:  # SystemError: a callback ran after it was raised
            fatal = raised if isinstance(raised, KafkaException) else raised.__cause__
            cause = fatal.args[0] if isinstance(fatal, KafkaException) and fatal.args else None
            if isinstance(cause, KafkaError) and is_authorization_failure(cause):
                doing = f"producing to topic {topic}"
                raise authorization_error(
                    cause, doing, [AclRequirement(ResourceType.TOPIC, topic, Operation.WRITE)]
                ) from raised

    def _wait_for_room(self, topic: str) -> None:
        """Serve delivery reports until the full producer queue may take a record, up to the deadline."""
        if self._deadline.passed():
            raise CallTimedOut(f"producing a record to {topic}", "the producer's queue stayed full")
        self._producer.poll(self._deadline.bound(0.1))

    def timed_out(self, timed_out: CallTimedOut) -> CommitTimeoutError:
        """The run's failure once a commit, a record or an abort gave up at the deadline, naming the
        commit's partitions (those processed since the last commit, outside a commit); nothing more
        is committed in this run."""
        committed = {txn.partition: txn.committed_offset for txn in self._committing}
        uncommitted = {txn.partition: txn.offset_to_commit for txn in self._committing}
        before = {p: "none" if offset is None else offset for p, offset in committed.items()}
        what = (
            f"{self._source_topic} partitions {sorted(uncommitted)}, processed up to offsets {uncommitted} (committed "
            f"before: {before})"
            if uncommitted
            else f"the messages of {self._source_topic} processed since the last commit"
        )
        exactly_once = self.transactions is not None
        aborted = (
            "Its open transaction is aborted (by this worker, by the broker after transaction.timeout.ms, or when the "
            "next worker with this transactional id starts): read_committed readers never see its records. "
            if exactly_once
            else ""
        )
        self._failure = CommitTimeoutError(
            f"Kafka did not answer in time: {timed_out}. Not committed: {what}; nothing more is committed in this "
            f"run, and the next run processes those messages again from the committed offsets. {aborted}Should Kafka "
            "complete this commit after the worker gave up, the next run finds the offsets committed and restores the "
            f"stores from their changelogs: nothing is lost{' or doubled' if exactly_once else ''} either way. Check "
            "that the brokers and the group and transaction coordinators answer; a longer max_seconds or grace lets "
            "a worker wait out longer outages.",
            committed,
            uncommitted,
        )
        return self._failure

    def _refuse_after_failure(self, partitions: list[int]) -> None:
        """Raise again when an earlier commit failed, or a delivery report since brought a failure."""
        if self._failure is not None:
            raise DeliveryError(
                f"a delivery failed earlier in this run, so nothing more is committed for {self._source_topic} "
                f"partitions {partitions}: close without committing and run again; the uncommitted messages will "
                f"be processed again. The first failure: {self._failure}"
            ) from self._failure
        if self._tracker.errors and self.transactions is None:  # a transaction aborts at its commit instead
            self._fail(0, partitions)

    def _fail(self, unacknowledged: int, partitions: list[int]) -> NoReturn:
        if self._tracker.refused:
            topic, refusal = next(iter(self._tracker.refused.items()))
            self._failure = authorization_error(
                refusal, f"producing to topic {topic}", [AclRequirement(ResourceType.TOPIC, topic, Operation.WRITE)]
            )
            raise self._failure
        errors = self._tracker.errors
        waited = self._delivery_timeout + FLUSH_MARGIN_SECONDS
        problems = [f"did not acknowledge {unacknowledged} records within {waited:.0f} s"] if unacknowledged else []
        if errors:
            problems.append(f"rejected {len(errors)} records ({'; '.join(errors[:5])})")
        self._failure = DeliveryError(
            f"Kafka {' and '.join(problems)}. Nothing was committed for "
            f"{self._source_topic} partitions {partitions}, nor will be in this run: those messages will be "
            "processed again by the next run. Check the brokers, the topics' min.insync.replicas and "
            f"max.message.bytes. Records that time out waited delivery.timeout.ms ({self._delivery_timeout:g} s) "
            "for unreachable brokers: raise it in the app's producer_config to ride out longer outages."
        )
        raise self._failure

    def _deliver_and_commit_offsets(
        self, pending: list[PartitionTransaction], prepared: Prepared
    ) -> dict[tuple[str, int], int]:
        """Deliver the commit's records and commit its source offsets; returns where each changed
        changelog partition ends (at-least-once, known before the offsets are committed, whose
        metadata records it)."""
        if self.transactions is not None:
            try:
                self.transactions.commit(self._offsets(pending, {}))
            except TransactionAborted:
                self._tracker.errors.clear()  # the aborted transaction's records are gone with it
                raise
            return self._positions.after_delivery(prepared)
        self._await_acknowledgements([txn.partition for txn in pending])
        positions = self._positions.after_delivery(prepared)
        self._source.commit(lambda: self._offsets(pending, positions))
        return positions

    def _await_acknowledgements(self, partitions: list[int]) -> None:
        if self._deadline.passed():
            raise CallTimedOut("committing the source offsets", "the worker's deadline passed")
        waited = self._delivery_timeout + FLUSH_MARGIN_SECONDS
        allowed = self._deadline.bound(waited)
        remaining = self._producer.flush(allowed)
        if remaining and allowed < waited:
            raise CallTimedOut(f"waiting for Kafka to acknowledge {remaining} records", "the worker's deadline passed")
        if remaining or self._tracker.errors:
            self._fail(remaining, partitions)
