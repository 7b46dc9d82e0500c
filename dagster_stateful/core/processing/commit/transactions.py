"""Kafka transactions for exactly-once processing: one producer's transaction lifecycle.

Owns `KafkaTransactions`: `init_transactions` when the worker starts (which fences any older
producer with the same transactional id and aborts what it left open), `begin()` before the first
record of a commit interval (outputs, dead letters and changelog records all go into the open
transaction), and `commit(offsets)`, which adds the source offsets with the consumer's group
metadata (so the group coordinator fences a zombie whose generation is gone) and commits. Kafka's
verdicts are classified as Kafka Streams does: retriable errors are retried within the timeout; an
abortable error aborts the transaction and raises `TransactionAborted` (the caller drops its
uncommitted work and processes again from the committed offsets); a fatal one (another producer
with this transactional id fenced this one) raises `ProducerFencedError`, after which this worker
must stop without committing; a refused ACL (the transactional id's, or a topic's) raises
`KafkaAuthorizationError` naming it, never retried. No call blocks past the run's deadline
(`lifecycle.Deadline`): the retries stop there, and `send_offsets_to_transaction`, which librdkafka
lets wait for an absent coordinator whatever its timeout, runs bounded (`kafka.bounded.BoundedCalls`);
past the deadline a call raises `CallTimedOut` and the transaction stays open until it is aborted
(by `abort`, by the broker after `transaction.timeout.ms`, or by the next worker with this
transactional id). An abort is retried like any call; one that runs out of time stays pending
(`aborting`), and librdkafka refuses a new transaction until it is resumed, which `begin` does.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import NoReturn, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.bounded import BoundedCalls, CallTimedOut
from dagster_stateful.core.kafka.security.acl_model import AclRequirement
from dagster_stateful.core.kafka.security.acls import transactional_id_prefix
from dagster_stateful.core.kafka.security.authorization import (
    authorization_error,
    is_authorization_failure,
    transacting,
)
from dagster_stateful.core.processing.lifecycle import Deadline
from dagster_stateful.errors import CommitTimeoutError, ConfigurationError, DeliveryError, ProducerFencedError

log = logging.getLogger(__name__)

_T = TypeVar("_T")

MIN_CALL_SECONDS = 1.0
"""The shortest timeout a transactional call is given while the transaction timeout lasts."""
ATTEMPT_SECONDS = 10.0
"""The timeout given to one try of a transactional call, which is tried again (librdkafka resumes a
call that timed out) while the transaction timeout lasts: a stalled try is logged and retried
instead of holding the worker for the whole transaction timeout in one silent wait."""
IDLE_CONNECTION_MS = 10_000
"""The transactional producer closes a broker connection idle this long. With librdkafka 2.16,
`send_offsets_to_transaction` otherwise may wait forever for a group coordinator whose broker died
and left the cluster's metadata: it looks for the new coordinator only when some broker connection
changes state (librdkafka#5511; seen in about half the runs of a three-broker cluster losing a
broker). While it waits, the producer's other connections fall idle, and closing them is such a
change, so the new coordinator is found within this time."""
CALL_MARGIN_SECONDS = 1.0
"""How much longer than its timeout a call run bounded is waited for, for librdkafka's verdict."""


class TransactionAborted(Exception):
    """The open transaction was aborted (a rebalance fenced its offsets, a record failed): nothing of
    it is visible, so the caller drops its uncommitted work and processes again from the committed
    offsets."""


def transactional_config(config: AppConfig, worker_client_id: str) -> dict[str, object]:
    """The producer settings exactly-once adds: the worker's transactional id (its static member id,
    or its host and state directory, so that a restarted worker fences its zombie), the
    transaction timeout, which also bounds the delivery timeout, and no re-bootstrapping (measured
    with librdkafka 2.16: after every broker was down, a re-bootstrapped transactional producer
    never sends the TxnOffsetCommit of `send_offsets_to_transaction`, which then waits until the
    producer is fenced; without it, the producer reconnects to the brokers it knew and the
    transaction goes on), and idle broker connections closed (see `IDLE_CONNECTION_MS`). Empty under
    at-least-once."""
    if not config.exactly_once:
        return {}
    identity = config.group_instance_id or hashlib.sha256(worker_client_id.encode()).hexdigest()[:16]
    return {
        "transactional.id": f"{transactional_id_prefix(config)}{identity}",
        "transaction.timeout.ms": config.transaction_timeout_ms,
        # A record may not wait longer than its transaction may stay open.
        "delivery.timeout.ms": config.transaction_timeout_ms,
        "metadata.recovery.strategy": "none",
        "connections.max.idle.ms": IDLE_CONNECTION_MS,
    }


def exactly_once_transactions(
    config: AppConfig, producer: Producer, consumer: Consumer, deadline: Deadline
) -> KafkaTransactions | None:
    """Exactly-once: the transactions of the worker's producer, not initialized yet (see
    `initialize_transactions`); None under at-least-once."""
    if not config.exactly_once:
        return None
    needs = transacting(config, transactional_id_prefix(config))
    return KafkaTransactions(producer, consumer, config.transaction_timeout_ms / 1000, deadline, needs)


def initialize_transactions(transactions: KafkaTransactions | None, app: str) -> None:
    """Initialize the transactions of app `app`'s worker (which fences older producers with its
    transactional id); nothing under at-least-once (None). Raises `CommitTimeoutError` when Kafka
    does not answer before the deadline."""
    if transactions is None:
        return
    try:
        transactions.initialize()
    except CallTimedOut as timed_out:
        raise CommitTimeoutError(
            f"the worker of app {app!r} could not start exactly-once processing: {timed_out}. "
            "Nothing was processed or committed. Check that the brokers and the transaction coordinator answer."
        ) from timed_out


def refuse_pinned_exactly_once(config: AppConfig, partitions: list[int] | None) -> None:
    """A run pinned to partitions commits outside the group, which cannot fence it: refused under exactly-once."""
    if config.exactly_once and partitions is not None:
        raise ConfigurationError(
            f"app {config.name!r} runs exactly-once, which a run pinned to partitions {partitions} cannot give: only "
            "the consumer group fences a zombie worker's transactions. Run the worker without partitions (it joins "
            "the group and takes its share), or restore chosen partitions with the restore job, which commits nothing."
        )


class KafkaTransactions:
    """The transactions of one transactional producer (its config names the transactional id)."""

    def __init__(
        self,
        producer: Producer,
        consumer: Consumer,
        timeout_seconds: float,
        deadline: Deadline | None = None,
        needs: Sequence[AclRequirement] = (),
    ) -> None:
        """timeout_seconds: how long a call retries (the transaction timeout); deadline: when every
        call must have returned (a bounded worker's; None: no deadline); needs: the ACLs the
        transactions need (see `authorization.transacting`), to name the one Kafka refuses."""
        self._needs = tuple(needs)
        self._producer = producer
        self._consumer = consumer
        self._timeout = timeout_seconds
        self._deadline = deadline or Deadline(None)
        self._calls = BoundedCalls("transactional producer")
        self.open = False
        self.aborting = False
        """True while an abort that timed out is pending (see `abort`)."""
        self.aborted = 0
        """Transactions aborted in this run (each one's messages were processed again)."""

    def initialize(self) -> None:
        """Register the transactional id with the broker, fencing older producers with the same id."""
        self._call("initializing transactions", lambda timeout: self._producer.init_transactions(timeout))

    def begin(self) -> None:
        """Open a transaction unless one is open; records produced from here on belong to it. An
        abort that timed out is resumed first (librdkafka refuses a new transaction until it ends)."""
        if self.aborting:
            self.abort()
        if not self.open:
            try:
                self._producer.begin_transaction()
            except KafkaException as error:
                self._raise_classified("beginning a transaction", _kafka_error(error), error)
            self.open = True

    def commit(self, offsets: list[TopicPartition]) -> None:
        """Add the source offsets to the open transaction and commit it (every produced record with it)."""
        self.begin()
        if offsets:  # none: a transaction of records only (dead letters while no partition progressed)
            metadata = self._consumer.consumer_group_metadata()
            self._call(
                "sending the source offsets to the transaction",
                lambda timeout: self._producer.send_offsets_to_transaction(offsets, metadata, timeout),
                bounded=True,
            )
        self._call("committing the transaction", lambda timeout: self._producer.commit_transaction(timeout))
        self.open = False

    def abort(self, seconds: float | None = None) -> None:
        """Abort the open transaction (nothing of it becomes visible to `read_committed` readers),
        trying again while Kafka says a retry may succeed, for at most `seconds` (default: the
        transaction timeout), never past the deadline. An abort that runs out of time raises
        `CallTimedOut` and stays pending (`aborting`): librdkafka resumes it on the next call, and
        refuses to begin a transaction until then."""
        if not self.open:
            return
        self.aborting = True
        self._call("aborting the transaction", self._abort_serving_reports, within=seconds, failed=self._abort_failed)
        self.aborting = self.open = False
        self.aborted += 1

    def _abort_serving_reports(self, timeout: float) -> None:
        # The abort waits for every outstanding record's delivery report, which a poll serves.
        self._producer.poll(0)
        self._producer.abort_transaction(max(0.1, timeout))

    def _abort_failed(self, doing: str, kafka_error: KafkaError | None, error: KafkaException) -> NoReturn:
        self.aborting = self.open = False
        if kafka_error is not None and kafka_error.fatal():
            raise ProducerFencedError(_fenced_message(doing, kafka_error)) from error
        raise error

    def abort_quietly(self, seconds: float | None = None) -> None:
        """Abort the open transaction of a run that stops without its final commit; a failure is only
        logged (the broker aborts the transaction after its timeout, or when the worker restarts)."""
        try:
            self.abort(seconds)
        except (KafkaException, DeliveryError, CallTimedOut) as error:
            log.warning("Aborting the open transaction failed (%s); the broker aborts it", error)

    def raise_if_fenced(self, doing: str, error: KafkaException) -> None:
        """Raise `ProducerFencedError` when `error` is the producer's fatal one: once fenced, a
        transactional producer refuses even to enqueue a record (librdkafka's _FATAL)."""
        kafka_error = _kafka_error(error)
        if kafka_error is not None and (kafka_error.fatal() or kafka_error.code() == KafkaError._FATAL):
            self.open = False
            raise ProducerFencedError(_fenced_message(doing, kafka_error)) from error

    def raise_if_aborting(self, doing: str, error: KafkaException) -> None:
        """Once the open transaction met an error that requires an abort (a broker lost its state in
        an outage, say), librdkafka refuses every record (`_STATE`): abort the transaction and raise
        `TransactionAborted`, so that the worker processes its messages again."""
        kafka_error = _kafka_error(error)
        if self.open and kafka_error is not None and kafka_error.code() == KafkaError._STATE:
            log.warning("%s failed (%s): aborting the transaction", doing.capitalize(), kafka_error.str())
            self.abort()
            raise TransactionAborted(f"{doing} failed: {kafka_error.str()}") from error

    def _call(
        self,
        doing: str,
        call: Callable[[float], _T],
        bounded: bool = False,
        within: float | None = None,
        failed: Callable[[str, KafkaError | None, KafkaException], NoReturn] | None = None,
    ) -> _T:
        """`call(timeout)` in tries of `ATTEMPT_SECONDS`, tried again within `within` seconds (default:
        the transaction timeout) while Kafka says a retry may succeed, never past the deadline (then
        `CallTimedOut`); any other failure goes to `failed` (default: classified as Kafka Streams does).
        bounded: the call may ignore its timeout (it waits for a broker that is down), so it runs
        in a thread waited for until the transaction timeout or the deadline, and the margin."""
        allowed = self._timeout if within is None else within
        until = time.monotonic() + allowed
        deadline = self._deadline if within is None else Deadline(until)
        last = "no try"
        while True:
            left = max(MIN_CALL_SECONDS, until - time.monotonic())
            seconds = deadline.bound(min(ATTEMPT_SECONDS, left))
            if seconds <= 0:
                raise CallTimedOut(doing, f"its time ran out (last try: {last})")
            try:
                if bounded:
                    wait = deadline.bound(left + CALL_MARGIN_SECONDS)
                    return self._calls.call(doing, partial(call, seconds), wait)
                return call(seconds)
            except KafkaException as error:
                kafka_error = _kafka_error(error)
                if kafka_error is not None and kafka_error.retriable():
                    last = kafka_error.str()
                    if time.monotonic() >= until:  # still retriable, out of time: what a broker outage looks like
                        raise CallTimedOut(doing, f"Kafka kept answering {last} for {allowed:.0f} s") from error
                    log.info("%s failed (%s); retrying", doing.capitalize(), last)
                    continue
                (failed or self._raise_classified)(doing, kafka_error, error)

    def _raise_classified(self, doing: str, kafka_error: KafkaError | None, error: KafkaException) -> NoReturn:
        if kafka_error is not None and is_authorization_failure(kafka_error):
            if not kafka_error.fatal():
                self.abort_quietly()
            self.open = False
            raise authorization_error(kafka_error, doing, self._needs) from error
        if kafka_error is not None and kafka_error.fatal():
            self.open = False
            raise ProducerFencedError(_fenced_message(doing, kafka_error)) from error
        if kafka_error is not None and kafka_error.txn_requires_abort():
            log.warning("%s failed (%s): aborting the transaction", doing.capitalize(), kafka_error.str())
            self.abort()
            raise TransactionAborted(f"{doing} failed: {kafka_error.str()}") from error
        raise error


def _kafka_error(error: KafkaException) -> KafkaError | None:
    return error.args[0] if error.args and isinstance(error.args[0], KafkaError) else None


def _fenced_message(doing: str, error: KafkaError) -> str:
    return (
        f"{doing} failed fatally ({error.str()}): another worker with the same transactional id started, so this "
        "one is a zombie and was fenced; or its transaction stayed open past transaction.timeout.ms (the brokers "
        "unreachable that long), and the broker aborted it and fenced it. Nothing more is committed by it; its "
        "open transaction is aborted and the next worker processes those messages again. If no other worker should "
        "be running, check that each worker has its own state directory or group_instance_id."
    )
