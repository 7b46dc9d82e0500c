"""The bounded worker: consume, process, commit, and stop when the run's limits say so.

Owns the worker's loop and lifetime: subscribing with the app's consumer group (cooperative-sticky
assignment, optional static membership), processing each message through the steps with the
app's error policy, committing every `commit_interval` seconds or `commit_every` messages, and
stopping when caught up (every assigned partition at its high watermark), after `max_messages`,
after `max_seconds`, or on SIGTERM, always with a final commit and a clean close. Partition
assignment and revocation are handled by `rebalance.PartitionAssignments`.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import RESTORE_CONSUMER_CONFIG, KafkaClients
from dagster_stateful.core.kafka.provisioning import provision
from dagster_stateful.core.kafka.records import position
from dagster_stateful.core.monitoring.listeners import AppState, Listeners
from dagster_stateful.core.monitoring.report import StopReason, WorkerReport
from dagster_stateful.core.processing.bad_input import BadInputHandler
from dagster_stateful.core.processing.commit import Committer, DeliveryTracker
from dagster_stateful.core.processing.dataframe import DROPPED, StepFailed, StreamingDataFrame
from dagster_stateful.core.processing.rebalance import PartitionAssignments
from dagster_stateful.core.recovery.changelog import Restorer
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.transaction import PartitionTransaction
from dagster_stateful.errors import ConfigurationError, ProcessingError, StateLockedError

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
        self._previous: Any = None

    def request(self, signum: int | None = None, frame: FrameType | None = None) -> None:
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

    def __init__(
        self,
        *,
        config: AppConfig,
        kafka: KafkaClients,
        dataframe: StreamingDataFrame,
        listeners: Listeners,
        state: StateDirectory,
        limits: RunLimits | None = None,
        partitions: list[int] | None = None,
    ) -> None:
        self.config = config
        self.kafka = kafka
        self.listeners = listeners
        self.state = state
        self.limits = limits or RunLimits()
        self.partitions = partitions
        self.stop = StopSignal()
        self.report = WorkerReport(config.name)
        self._dataframe = dataframe
        self._stateful = dataframe.is_stateful

    def run(self) -> WorkerReport:
        config = self.config
        started = time.monotonic()
        activity = self.state.activity_lock()
        activity.hold_shared()
        self.stop.install()
        self._open_clients()
        failed = False
        try:
            plan = provision(config, self.kafka)
            if self.partitions is None:
                self._consumer.subscribe(
                    [config.source],
                    on_assign=self._assignments.on_assign,
                    on_revoke=self._assignments.on_revoke,
                    on_lost=self._assignments.on_lost,
                )
            else:
                self._assign_manually(plan.check(config.source).found_partitions or 0)
            self.report.stop_reason = self._loop(started)
            self.listeners.transition(AppState.PENDING_SHUTDOWN)
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
                self.listeners.transition(AppState.ERROR)
            self._close()
            activity.release()
            self.stop.restore()
            self.report.skipped = self._bad_input.skipped
            self.report.dead_lettered = self._bad_input.dead_lettered
            self.report.seconds = time.monotonic() - started
            if not failed:
                self.listeners.transition(AppState.NOT_RUNNING)
        log.info(
            "Worker of %r stopped (%s): %d messages, lag left %d, %d rebalances, %.1f s",
            config.name,
            self.report.stop_reason,
            self.report.total_processed,
            self.report.total_lag,
            self.report.rebalances,
            self.report.seconds,
        )
        return self.report

    def _open_clients(self) -> None:
        config, kafka = self.config, self.kafka
        consumer_config = {
            "group.id": config.consumer_group,
            "client.id": self.state.worker_client_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "cooperative-sticky",
            **({"group.instance.id": config.group_instance_id} if config.group_instance_id else {}),
            **config.consumer_config,
        }
        self._consumer = kafka.consumer(consumer_config)
        self._tracker = DeliveryTracker()
        self._producer = kafka.producer(
            {
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "partitioner": "murmur2_random",
                "on_delivery": self._tracker,
                **config.producer_config,
            }
        )
        self._restore_consumer = kafka.consumer(
            {"group.id": f"{config.consumer_group}-restore", **RESTORE_CONSUMER_CONFIG}
        )
        changelogs = config.changelog_topics()
        self._committer = Committer(self._consumer, self._producer, self._tracker, config.source, changelogs)
        self._bad_input = BadInputHandler(config.on_error, self._producer, config.dead_letter_topic)
        restorer = Restorer(self._restore_consumer, self.listeners, config.restore_batch_size)
        self._offset_reader = kafka.consumer({"group.id": config.consumer_group, "enable.auto.commit": False})
        self._assignments = PartitionAssignments(
            config,
            self.state,
            self.listeners,
            restorer if changelogs else None,
            self.report,
            self._commit,
            self._offset_reader,
        )

    def _assign_manually(self, source_partitions: int) -> None:
        unknown = sorted(set(self.partitions or ()) - set(range(source_partitions)))
        if unknown:
            raise ConfigurationError(
                f"{self.config.source} has partitions 0..{source_partitions - 1}; there is no partition {unknown}"
            )
        group = self.kafka.describe_group(self.config.consumer_group, self.config.source)
        if group.members:
            raise StateLockedError(
                f"consumer group {self.config.consumer_group!r} has {len(group.members)} active member(s) "
                f"({', '.join(sorted(set(group.owners().values())))}); a run pinned to partitions {self.partitions} "
                "must not compete with them. Wait until they stop (bounded runs end by themselves) and retry."
            )
        topic_partitions = [TopicPartition(self.config.source, p) for p in sorted(set(self.partitions or ()))]
        self._assignments.on_assign(self._consumer, topic_partitions)
        self._assignments.raise_failure()
        self._consumer.assign(topic_partitions)

    def _loop(self, started: float) -> StopReason:
        limits, config = self.limits, self.config
        last_commit = time.monotonic()
        since_commit = processed = 0
        next_check = 0.0
        while True:
            if self.stop.requested:
                return StopReason.STOP_REQUESTED
            now = time.monotonic()
            if limits.max_seconds is not None and now - started >= limits.max_seconds:
                return StopReason.MAX_SECONDS
            messages = self._consumer.consume(CONSUME_BATCH, timeout=0.2)
            self._assignments.raise_failure()
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(error)
                if self._process(message):
                    processed += 1
                    since_commit += 1
                if limits.max_messages is not None and processed >= limits.max_messages:
                    return StopReason.MAX_MESSAGES
                if since_commit >= config.commit_every:
                    self._commit()
                    since_commit, last_commit = 0, time.monotonic()
            if time.monotonic() - last_commit >= config.commit_interval:
                self._commit()
                since_commit, last_commit = 0, time.monotonic()
            if limits.until_caught_up and not messages and time.monotonic() >= next_check:
                if self._caught_up():
                    return StopReason.CAUGHT_UP if self._assignments.transactions else StopReason.NO_PARTITIONS
                next_check = time.monotonic() + CAUGHT_UP_CHECK_INTERVAL

    def _process(self, message: Message) -> bool:
        """Process one message; False when its partition is no longer ours."""
        _, partition, offset = position(message)
        txn = self._assignments.transactions.get(partition)
        if txn is None:
            return False
        config = self.config
        raw_key, raw_value = message.key(), message.value()
        try:
            if raw_key is not None:
                config.key_serde.loads(raw_key)
            value = config.value_serde.loads(raw_value) if raw_value is not None else None
        except Exception as error:  # noqa: BLE001 - any codec failure is bad input
            return self._reject(message, txn, "deserializing the key or value", error)
        if self._stateful:
            if raw_key is None:
                return self._reject(
                    message,
                    txn,
                    "stateful step",
                    ValueError("stateful steps need a message key; this message has none"),
                )
            txn.begin_message(raw_key)
        try:
            result = self._dataframe.run(value, txn.states)
        except StepFailed as failure:
            return self._reject(message, txn, f"step {failure.step!r}", failure.error)
        txn.accept_message(offset)
        if config.emits_output and result is not DROPPED:
            self._produce_output(raw_key, config.output_serde.dumps(result))
        self._count(partition)
        return True

    def _reject(self, message: Message, txn: PartitionTransaction, stage: str, error: BaseException) -> bool:
        """Apply the error policy (raises under "raise"); the message then moves the offset only."""
        txn.discard_message()
        self._bad_input.handle(message, stage, error)
        _, partition, offset = position(message)
        txn.pass_message(offset)
        self._count(partition)
        return True

    def _count(self, partition: int) -> None:
        counts = self.report.messages_processed
        counts[partition] = counts.get(partition, 0) + 1

    def _produce_output(self, key: bytes | None, value: bytes) -> None:
        assert self.config.output is not None, "emits_output implies an output topic"
        while True:
            try:
                self._producer.produce(self.config.output, key=key, value=value)
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
        marks = self.kafka.watermarks(self.config.source, transactions)
        return {p: max(0, high - _next_or(transactions[p].next_offset, low)) for p, (low, high) in marks.items()}

    def _close(self) -> None:
        self._assignments.shutting_down = True
        try:
            self._consumer.close()
            self._assignments.raise_failure()
        except Exception:
            log.exception("Closing the consumer of %r failed", self.config.name)
        self._assignments.close_all()
        self._producer.flush(30)
        self._restore_consumer.close()
        self._offset_reader.close()


def _next_or(offset: int | None, default: int) -> int:
    return default if offset is None else offset
