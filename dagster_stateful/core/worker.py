"""The bounded worker: consume, process, commit, and stop when the run's limits say so.

Owns the worker's loop and lifetime: subscribing with the app's consumer group (cooperative-sticky
assignment, optional static membership), processing each message through the steps with the
app's error policy, committing every `commit_interval` seconds or `commit_every` messages, and
stopping when caught up (every assigned partition at its high watermark), after `max_messages`,
after `max_seconds`, or on SIGTERM, always with a final commit and a clean close. Partition
assignment and revocation are handled by `assignment.PartitionAssignments`.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from dagster_stateful.core.assignment import PartitionAssignments
from dagster_stateful.core.bad_input import BadInputHandler
from dagster_stateful.core.commit import Committer, DeliveryTracker
from dagster_stateful.core.kafka import RESTORE_CONSUMER_CONFIG
from dagster_stateful.core.dataframe import DROPPED, StepFailed
from dagster_stateful.core.listeners import AppState
from dagster_stateful.core.recovery import Restorer
from dagster_stateful.core.report import WorkerReport
from dagster_stateful.core.state import PartitionTransaction
from dagster_stateful.errors import ConfigurationError, ProcessingError, StateLockedError

if TYPE_CHECKING:
    from dagster_stateful.core.app import App

log = logging.getLogger(__name__)

CONSUME_BATCH = 1000
CAUGHT_UP_CHECK_INTERVAL = 0.5
EMPTY_ASSIGNMENT_GRACE = 5.0
"""Seconds a worker must hold no partition, after joining, before a bounded run stops idle."""


@dataclass(frozen=True)
class RunLimits:
    max_messages: int | None = None
    max_seconds: float | None = None
    until_caught_up: bool = True


class StopSignal:
    """Set by SIGTERM (when the worker runs on the main thread) or by `request()`."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def request(self, *_: object) -> None:
        self.requested = True

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self.request)

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None


class Worker:
    """One bounded run. With `partitions`, the worker takes exactly those source partitions (manual
    assignment, no group rebalancing: for restoring or inspecting chosen partitions while no other
    worker of the app runs); otherwise it joins the app's consumer group."""

    def __init__(self, app: App, limits: RunLimits | None = None, partitions: list[int] | None = None) -> None:
        self.app = app
        self.limits = limits or RunLimits()
        self.partitions = partitions
        self.stop = StopSignal()
        self.report = WorkerReport(app.name)

    def run(self) -> WorkerReport:
        app = self.app
        started = time.monotonic()
        activity = app.activity_lock()
        activity.hold_shared()
        self.stop.install()
        self._open_clients()
        failed = False
        try:
            plan = app.provision()
            if self.partitions is None:
                self._consumer.subscribe([app.source], on_assign=self._assignments.on_assign,
                                         on_revoke=self._assignments.on_revoke, on_lost=self._assignments.on_lost)
            else:
                self._assign_manually(plan.check(app.source).found_partitions or 0)
            self.report.stop_reason = self._loop(started)
            app.listeners.transition(AppState.PENDING_SHUTDOWN)
            self._commit()
            self.report.lag = self._lag()
        except ProcessingError:
            failed = True
            self._commit()  # everything before the bad message; its own offset stays uncommitted
            raise
        except BaseException:
            failed = True
            raise
        finally:
            if failed:
                app.listeners.transition(AppState.ERROR)
            self._close()
            activity.release()
            self.stop.restore()
            self.report.skipped = self._bad_input.skipped
            self.report.dead_lettered = self._bad_input.dead_lettered
            self.report.seconds = time.monotonic() - started
            if not failed:
                app.listeners.transition(AppState.NOT_RUNNING)
        log.info("Worker of %r stopped (%s): %d messages, lag left %d, %d rebalances, %.1f s", app.name,
                 self.report.stop_reason, self.report.total_processed, self.report.total_lag, self.report.rebalances,
                 self.report.seconds)
        return self.report

    def _open_clients(self) -> None:
        app = self.app
        consumer_config = {
            "group.id": app.consumer_group, "client.id": app.worker_client_id,
            "enable.auto.commit": False, "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest", "partition.assignment.strategy": "cooperative-sticky",
            **({"group.instance.id": app.group_instance_id} if app.group_instance_id else {}),
            **app.consumer_config,
        }
        self._consumer = app.kafka.consumer(consumer_config)
        self._tracker = DeliveryTracker()
        self._producer = app.kafka.producer({
            "acks": "all", "enable.idempotence": True, "linger.ms": 5, "partitioner": "murmur2_random",
            "on_delivery": self._tracker, **app.producer_config,
        })
        self._restore_consumer = app.kafka.consumer({"group.id": f"{app.consumer_group}-restore",
                                                     **RESTORE_CONSUMER_CONFIG})
        changelogs = {store: app.changelog_topic(store) for store in app.stores} if app.use_changelog_topics else None
        self._committer = Committer(self._consumer, self._producer, self._tracker, app.source, changelogs)
        self._bad_input = BadInputHandler(app.on_error, self._producer, app.dead_letter_topic)
        self._dataframe = app.dataframe()
        self._stateful = self._dataframe.is_stateful
        restorer = Restorer(self._restore_consumer, app.listeners, app.restore_batch_size)
        self._offset_reader = app.kafka.consumer({"group.id": app.consumer_group, "enable.auto.commit": False})
        self._assignments = PartitionAssignments(app, restorer if changelogs else None, self.report, self._commit,
                                                 self._offset_reader)

    def _assign_manually(self, source_partitions: int) -> None:
        unknown = sorted(set(self.partitions or ()) - set(range(source_partitions)))
        if unknown:
            raise ConfigurationError(f"{self.app.source} has partitions 0..{source_partitions - 1}; there is no "
                                     f"partition {unknown}")
        group = self.app.kafka.describe_group(self.app.consumer_group, self.app.source)
        if group.members:
            raise StateLockedError(
                f"consumer group {self.app.consumer_group!r} has {len(group.members)} active member(s) "
                f"({', '.join(sorted(set(group.owners().values())))}); a run pinned to partitions {self.partitions} "
                "must not compete with them. Wait until they stop (bounded runs end by themselves) and retry.")
        topic_partitions = [TopicPartition(self.app.source, p) for p in sorted(set(self.partitions or ()))]
        self._assignments.on_assign(self._consumer, topic_partitions)
        self._assignments.raise_failure()
        self._consumer.assign(topic_partitions)

    def _loop(self, started: float) -> str:
        limits, app = self.limits, self.app
        last_commit = time.monotonic()
        since_commit = processed = 0
        next_check = 0.0
        while True:
            if self.stop.requested:
                return "stop requested (SIGTERM)"
            now = time.monotonic()
            if limits.max_seconds is not None and now - started >= limits.max_seconds:
                return "max_seconds"
            messages = self._consumer.consume(CONSUME_BATCH, timeout=0.2)
            self._assignments.raise_failure()
            for message in messages:
                if message.error():
                    if message.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(message.error())
                if self._process(message):
                    processed += 1
                    since_commit += 1
                if limits.max_messages is not None and processed >= limits.max_messages:
                    return "max_messages"
                if since_commit >= app.commit_every:
                    self._commit()
                    since_commit, last_commit = 0, time.monotonic()
            if time.monotonic() - last_commit >= app.commit_interval:
                self._commit()
                since_commit, last_commit = 0, time.monotonic()
            if limits.until_caught_up and not messages and time.monotonic() >= next_check:
                if self._caught_up():
                    return "caught_up" if self._assignments.transactions else "no partitions assigned"
                next_check = time.monotonic() + CAUGHT_UP_CHECK_INTERVAL

    def _process(self, message: Message) -> bool:
        """Process one message; False when its partition is no longer ours."""
        partition = message.partition()
        txn = self._assignments.transactions.get(partition)
        if txn is None:
            return False
        app = self.app
        offset = message.offset()
        raw_key, raw_value = message.key(), message.value()
        try:
            if raw_key is not None:
                app.key_serde.loads(raw_key)
            value = app.value_serde.loads(raw_value) if raw_value is not None else None
        except Exception as error:  # noqa: BLE001 - any codec failure is bad input
            return self._reject(message, txn, "deserializing the key or value", error)
        if self._stateful:
            if raw_key is None:
                return self._reject(message, txn, "stateful step",
                                    ValueError("stateful steps need a message key; this message has none"))
            txn.begin_message(raw_key)
        try:
            result = self._dataframe.run(value, txn.states)
        except StepFailed as failure:
            return self._reject(message, txn, f"step {failure.step!r}", failure.error)
        txn.accept_message(offset)
        if app.emits_output and result is not DROPPED:
            self._produce_output(raw_key, app.output_serde.dumps(result))
        self._count(partition)
        return True

    def _reject(self, message: Message, txn: PartitionTransaction, stage: str, error: BaseException) -> bool:
        """Apply the error policy (raises under "raise"); the message then moves the offset only."""
        txn.discard_message()
        self._bad_input.handle(message, stage, error)
        txn.pass_message(message.offset())
        self._count(message.partition())
        return True

    def _count(self, partition: int) -> None:
        counts = self.report.messages_processed
        counts[partition] = counts.get(partition, 0) + 1

    def _produce_output(self, key: bytes | None, value: bytes) -> None:
        while True:
            try:
                self._producer.produce(self.app.output, key=key, value=value)
                return
            except BufferError:
                self._producer.poll(0.1)

    def _commit(self) -> None:
        committed = self._committer.commit(self._assignments.transactions.values())
        self.report.committed_offsets.update(committed)

    def _caught_up(self) -> bool:
        transactions = self._assignments.transactions
        if not transactions:
            # Cooperative rebalancing assigns in two rounds: an empty first round says little.
            idle_since = self._assignments.empty_since
            return idle_since is not None and time.monotonic() - idle_since >= EMPTY_ASSIGNMENT_GRACE
        return not any(self._lag().values())

    def _lag(self) -> dict[int, int]:
        """Messages left per assigned partition. One admin request for all partitions: asking the
        fetching consumer would queue behind its long-polling fetches."""
        transactions = self._assignments.transactions
        marks = self.app.kafka.watermarks(self.app.source, transactions)
        return {p: max(0, high - (transactions[p].next_offset if transactions[p].next_offset is not None else low))
                for p, (low, high) in marks.items()}

    def _close(self) -> None:
        self._assignments.shutting_down = True
        try:
            self._consumer.close()
            self._assignments.raise_failure()
        except Exception:  # noqa: BLE001 - closing must go on
            log.exception("Closing the consumer of %r failed", self.app.name)
        self._assignments.close_all()
        self._producer.flush(30)
        self._restore_consumer.close()
        self._offset_reader.close()
