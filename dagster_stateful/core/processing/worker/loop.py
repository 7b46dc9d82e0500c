"""The bounded worker: consume, process, commit, and stop when the run's limits say so.

Owns the worker's loop and lifetime: subscribing with the app's consumer group (cooperative-sticky, optional
static membership), processing each consumed batch through the steps (`batch`, with the app's error policy),
committing every `commit_interval` seconds or `commit_every` messages, and stopping when caught up (every
assigned partition at its end), after `max_messages` or `max_seconds`, or on SIGTERM, with a final commit and
a clean close. Rebalances are `rebalance.PartitionAssignments`'. Under exactly-once the producer is
transactional (one transactional id per worker), the consumer reads `read_committed`, an aborted transaction
rewinds every partition to its committed offset, and runs pinned to partitions are refused. On each turn of the
loop the wall clock fires timers (`timer_firing`), closes idle partitions' windows (`idle_windows`), and a
joined stream's records are processed where the task partition is at its end (`joined_streams`).

A run with `max_seconds` ends within it plus its grace (`RunLimits.grace_seconds`), whatever the brokers
do: commits and admin calls give up `lifecycle.CLOSE_RESERVE_SECONDS` before that end (`CommitTimeoutError`
names what was not committed); closing the clients takes what is left, a close not done by then is left to
the background (`kafka.bounded`). An authentication or TLS failure a client reports is raised at once
(`KafkaClients.check_security`); nothing more is committed.
"""

from __future__ import annotations

import logging
import time
from functools import partial

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.gc_pause import gc_paused
from dagster_stateful.core.kafka.bounded import BoundedCalls, CallTimedOut
from dagster_stateful.core.kafka.clients import RESTORE_CONSUMER_CONFIG, KafkaClients
from dagster_stateful.core.kafka.provisioning import provision
from dagster_stateful.core.monitoring.listeners import AppState, Listeners
from dagster_stateful.core.monitoring.report import StopReason, WorkerReport
from dagster_stateful.core.processing.commit.committer import Committer, StoresDamaged
from dagster_stateful.core.processing.commit.delivery import DeliveryTracker, delivery_timeout_seconds
from dagster_stateful.core.processing.commit.repartition_purge import RepartitionPurge
from dagster_stateful.core.processing.commit.transactions import (
    TransactionAborted,
    exactly_once_transactions,
    initialize_transactions,
    refuse_pinned_exactly_once,
)
from dagster_stateful.core.processing.dsl.dataframe import StreamingDataFrame
from dagster_stateful.core.processing.dsl.joins import GlobalTable
from dagster_stateful.core.processing.lifecycle import CLOSE_TIMEOUT_SECONDS, Deadline, RunLimits, StopSignal
from dagster_stateful.core.processing.paths.bad_input import BadInputHandler
from dagster_stateful.core.processing.paths.batch import BatchProcessor
from dagster_stateful.core.processing.paths.emission import commit_emitter
from dagster_stateful.core.processing.paths.idle_windows import idle_windows
from dagster_stateful.core.processing.paths.rekeying import Rekeying
from dagster_stateful.core.processing.paths.timer_firing import timer_firing
from dagster_stateful.core.processing.restores.background import background_restores
from dagster_stateful.core.processing.standbys.replicas import standbys_for
from dagster_stateful.core.processing.worker.batch_routing import partitioned_tables, worker_path
from dagster_stateful.core.processing.worker.client_settings import worker_consumer_config, worker_producer_config
from dagster_stateful.core.processing.worker.global_tables import GlobalTables
from dagster_stateful.core.processing.worker.joined_streams import joined_streams
from dagster_stateful.core.processing.worker.progress import Progress
from dagster_stateful.core.processing.worker.rebalance import PartitionAssignments
from dagster_stateful.core.recovery.restorer import Restorer
from dagster_stateful.core.recovery.snapshot_format import SnapshotStore
from dagster_stateful.core.state.cache import bound_caches
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.errors import (
    DeliveryError,
    KafkaSecurityError,
    ProcessingError,
    StatefulError,
    StateStoreError,
    StoreCorruptedError,
    TopicMismatchError,
)

__all__ = ["RunLimits", "StopSignal", "Worker"]

log = logging.getLogger(__name__)

CONSUME_BATCH = 1000
CAUGHT_UP_CHECK_INTERVAL = 0.5
EMPTY_ASSIGNMENT_GRACE = 5.0
"""Seconds a worker must hold no partition, after joining, before a bounded run may stop idle."""
_CONSUMERS = (("_consumer", "consumer"), ("_restore_consumer", "restore consumer"), ("_offset_reader", "offset reader"))


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
        snapshot_root: str | None = None,
        global_tables: list[GlobalTable] | None = None,
    ) -> None:
        """snapshot_root: where the stores' snapshots live; restores load one when that is faster.
        global_tables: the tables the steps join with, which the worker keeps whole (`global_tables`)."""
        self._global_tables = global_tables or []
        self.config = config
        self.kafka = kafka
        self.listeners = listeners
        self.state = state
        self.limits = limits or RunLimits()
        self.partitions = partitions
        self.snapshot_root = snapshot_root
        self.stop = StopSignal()
        self.report = WorkerReport(config.name, processing_guarantee=config.processing_guarantee.value)
        self._dataframe = dataframe
        self._commit_deadline = self._end = Deadline(None)
        """When commits give up, and when the run must have ended (see `RunLimits.deadlines`)."""
        self._consumer_calls = BoundedCalls("consumer")

    def run(self) -> WorkerReport:
        config = self.config
        started = time.monotonic()
        self._commit_deadline, self._end = self.limits.deadlines(started)
        self.kafka = self.kafka.until(self._commit_deadline.at)
        activity = self.state.activity_lock()
        failed = False
        try:
            refuse_pinned_exactly_once(self.config, self.partitions)
            activity.hold_shared()
            self.stop.install()
            self._open_clients()
            plan = provision(config, self.kafka, store_configs=self._dataframe.changelog_configs())
            # After provisioning, whose admin calls raise a refused login within seconds (this one would time out).
            initialize_transactions(self._committer.transactions, config.name)
            self._globals.bootstrap(self._commit_deadline)  # before joining: a record sees the whole table
            if self.partitions is None:
                self._consumer.subscribe(
                    list(config.input_topics),
                    on_assign=self._assignments.on_assign,
                    on_revoke=self._assignments.on_revoke,
                    on_lost=self._assignments.on_lost,
                )
            else:
                found = plan.check(config.task_topic).found_partitions or 0
                starts = self._assignments.take_pinned(self.partitions, found)
                self._consumer.assign(starts)
                self._consumer.pause(starts)
            self.report.stop_reason = self._loop(started)
            self.listeners.transition(AppState.PENDING_SHUTDOWN)
            self._commit()
            self._commit()  # what the final commit's stream time expired: a store left tidy
            if self._purge is not None:
                self._purge.purge()
        except ProcessingError:
            failed = True
            if not self._committer.failed:
                self._commit()  # everything before the bad message; its own offset stays uncommitted
            raise
        except (DeliveryError, StateStoreError, KafkaSecurityError, TopicMismatchError):
            failed = True
            if hasattr(self, "_assignments"):
                self._assignments.dirty = True  # Kafka Streams' dirty close: nothing more is committed
            raise
        except BaseException:
            failed = True
            raise
        finally:
            if failed:
                self.listeners.transition(AppState.ERROR)
            self._close(failed)
            activity.release()
            self.stop.restore()
            self._finish_report(started)
            if not failed:
                self.listeners.transition(AppState.NOT_RUNNING)
        log.info("Worker of %r stopped (%s)", config.name, self.report.outcome)
        return self.report

    def _finish_report(self, started: float) -> None:
        report = self.report
        if hasattr(self, "_assignments"):
            report.restores = list(self._assignments.restorations.reports)
            report.skipped, report.dead_lettered, report.late = self._bad_input.counts
            report.store_metrics, report.store_totals, report.commit_latency = self._committer.metrics.summary()
            report.partition_store_metrics = self._committer.metrics.partition_metrics()
            report.standby_records, report.standby_holders = self._standbys.summary() if self._standbys else ({}, {})
            report.messages_in_columns = self._batches.messages_in_columns
            report.table_records_applied = self._tables.applied + self._source_tables.applied
            report.timers_fired = self._firing.fired if self._firing else 0
            report.stream_records_joined = self._streams.processed if self._streams else 0
            report.windows_closed_idle = self._idle.closed if self._idle else 0
            try:
                report.lag, *upstream = self._progress.lags()
                report.upstream_lag = upstream[0] if upstream else {}
            except StatefulError as error:
                log.warning("Could not read the lag left on %s: %s", ", ".join(self.config.input_topics), error)
        report.seconds = time.monotonic() - started

    def _open_clients(self) -> None:
        config, kafka = self.config, self.kafka
        consumer_config = worker_consumer_config(config, self.state.worker_client_id)
        self._consumer = kafka.consumer(consumer_config)
        self._tracker = DeliveryTracker()
        producer_config = worker_producer_config(config, self.state.worker_client_id, self._tracker)
        self._producer = kafka.producer(producer_config)
        transactions = exactly_once_transactions(config, self._producer, self._consumer, self._commit_deadline)
        self._restore_consumer = kafka.consumer({"group.id": config.restore_group, **RESTORE_CONSUMER_CONFIG})
        changelogs = config.changelog_topics()
        self._committer = Committer(
            self._consumer,
            self._producer,
            self._tracker,
            config.task_topic,
            changelogs,
            delivery_timeout_seconds(producer_config),
            transactions,
            self._commit_deadline,
            config.consumer_group,
            kafka.ends,
        )
        self._bad_input = BadInputHandler(config.on_error, self._committer.produce, config.dead_letter_topic)
        self._tables, self._source_tables = partitioned_tables(
            self._dataframe, config, kafka, self.state.app_dir, self._bad_input, self._commit_deadline
        )
        restorer = Restorer(
            kafka, self._restore_consumer, self.listeners, config.restore_batch_size, group=config.restore_group
        )
        self._offset_reader = kafka.consumer({"group.id": config.consumer_group, "enable.auto.commit": False})
        self._standbys = standbys_for(config, kafka, self.state, self._consumer, self._offset_reader, self.partitions)
        strategy = str(consumer_config.get("partition.assignment.strategy", ""))
        self._rekeying = Rekeying.of_app(
            config, self._dataframe, self._bad_input, self._committer.produce, self.report.rekeyed, self._source_tables
        )
        self._purge = RepartitionPurge.of_app(config, kafka)
        self._globals = GlobalTables(self._global_tables, config, kafka, self.state.app_dir, self._bad_input)
        parts = (self._bad_input, self._committer.produce, self._commit_deadline, self._consumer, self._globals)
        self._streams = joined_streams(config, self._dataframe, kafka, *parts)
        self._assignments = PartitionAssignments(
            config,
            kafka,
            self.state,
            self.listeners,
            restorer if changelogs else None,
            self.report,
            self._commit,
            self._offset_reader,
            cooperative="cooperative" in strategy,
            snapshots=partial(SnapshotStore, self.snapshot_root, config.name) if self.snapshot_root else None,
            drop_in_flight=self._abort_in_flight if config.exactly_once else None,
            live_stores=self._dataframe.live_stores,
            timer_store=self._dataframe.timers.store if self._dataframe.timers else None,
            standbys=self._standbys,
            background=background_restores(config, kafka, self.listeners, self.state),
            rekeying=self._rekeying,
            tables=self._tables or self._streams,
        )
        waiting = self._tables.first_waiting if self._tables.grace_ms else None
        pinned = self.partitions is not None
        self._progress = Progress(kafka, self._consumer, config, self._assignments, pinned, waiting, self._streams)
        self._transactions = self._assignments.transactions
        self._firing = timer_firing(config, self._dataframe, self._committer.produce, self._bad_input)
        self._idle = idle_windows(config, self._dataframe, self._committer.produce, self._bad_input)
        self._clock_turns = [t.on_wall_clock for t in (self._firing, self._idle, self._streams) if t is not None]
        per_message = partial(
            BatchProcessor,
            config,
            self._dataframe,
            self._transactions,
            self._assignments.restorations,
            self._bad_input,
            self._committer.produce,
            self.report.messages_processed,
            self._recover_damaged,
            firing=self._firing,
            streams=self._streams,
        )
        self._batches, self._consume_batch = worker_path(
            config, self._dataframe, per_message, CONSUME_BATCH, self._tables, self._rekeying
        )
        self._emitter = commit_emitter(config, self._dataframe, self._committer.produce, self._bad_input)

    def _loop(self, started: float) -> StopReason:
        limits, config = self.limits, self.config
        last_commit = time.monotonic()
        since_commit = processed = 0
        next_check = 0.0
        consuming = f"consuming {', '.join(config.input_topics)} in consumer group {config.consumer_group!r}"
        while True:
            # Here every message consume() returned has been processed (see `progress.pass_markers`).
            if self.stop.requested:
                self._pass_markers()
                return StopReason.STOP_REQUESTED
            now = time.monotonic()
            if limits.max_seconds is not None and now - started >= limits.max_seconds:
                self._pass_markers()
                return StopReason.MAX_SECONDS
            self._globals.poll()
            restoring = bool(self._assignments.restorations)
            if restoring:  # open new partitions' stores, replay one changelog batch, resume those up to date
                self._assignments.advance(self._consumer)
            busy = (restoring and self._assignments.restorations.replaying_here) or bool(
                self._standbys and self._standbys.tailing
            )
            messages = self._consumer.consume(self._consume_batch, timeout=0.0 if busy else 0.2)
            self.kafka.check_security(consuming)
            self._assignments.raise_failure()
            with gc_paused():  # a batch and its commit allocate much, and free it by reference counting
                index = 0
                while index < len(messages):
                    budget = config.commit_every - since_commit
                    if limits.max_messages is not None:
                        budget = min(budget, limits.max_messages - processed)
                    try:
                        index, done = self._batches.process(messages, index, budget)
                    except TransactionAborted:  # a record was refused: the transaction needed an abort
                        self._rewind()
                        break
                    processed += done
                    since_commit += done
                    if limits.max_messages is not None and processed >= limits.max_messages:
                        return StopReason.MAX_MESSAGES
                    if since_commit >= config.commit_every:
                        committed = self._commit()
                        since_commit, last_commit = 0, time.monotonic()
                        if not committed:
                            break  # the rest of this batch comes again from the rewound offsets
                if time.monotonic() - last_commit >= config.commit_interval or self._caches_overflow():
                    self._pass_markers()
                    self._commit()
                    since_commit, last_commit = 0, time.monotonic()
                for turn in self._clock_turns:  # wall-clock timers, idle partitions' windows
                    turn(self._transactions.values())
            if self._standbys is not None:
                self._standbys.advance(self._assignments.held)
            if limits.until_caught_up and not messages and not restoring and time.monotonic() >= next_check:
                if self._caught_up():
                    self._pass_markers()
                    return StopReason.NO_PARTITIONS if self._assignments.holds_nothing else StopReason.CAUGHT_UP
                next_check = time.monotonic() + CAUGHT_UP_CHECK_INTERVAL

    def _close_time(self) -> float:
        return self._end.bound(CLOSE_TIMEOUT_SECONDS)

    def _commit_before_closing(self, assignments: PartitionAssignments) -> None:
        """Commit what the held partitions processed since the last commit, as their revocation would
        (a failure is only logged: the run's own error is the one raised); nothing after a failure."""
        if assignments.dirty or not assignments.transactions or self._committer.failed:
            return
        try:
            self._commit()
        except Exception:
            log.exception("Committing the partitions of %r before closing failed", self.config.name)

    def _caches_overflow(self) -> bool:
        """Evict what the record caches hold past `cache_max_bytes`; True when only a commit can help."""
        caches = [cache for txn in self._transactions.values() for cache in txn.caches.values()]
        held, overflow = bound_caches(caches, self.config.cache_max_bytes)
        self.report.cache_bytes_peak = max(self.report.cache_bytes_peak, held)
        self.report.cache_commits += overflow
        return overflow

    def _recover_damaged(self, partition: int, damage: StoreCorruptedError) -> None:
        self._assignments.recover_corrupted(self._consumer, partition, damage)

    def _commit(self) -> bool:
        """Commit every processed partition; never again once a delivery failed (a dirty close).
        Returns False when Kafka aborted the transaction and every partition was rewound."""
        if self._assignments.dirty:
            return True
        if self._emitter:
            self._emitter.emit(self._assignments.transactions.values())
        rekeying = self._rekeying
        upstream = rekeying.offsets_to_commit() if rekeying is not None else None
        try:
            committed = self._committer.commit(self._assignments.transactions.values(), upstream)
        except StoresDamaged as damage:
            committed = damage.committed
            for partition, error in damage.errors.items():
                self._assignments.recover_corrupted(self._consumer, partition, error)
        except TransactionAborted:
            self._rewind()
            return False
        self.report.committed_offsets.update(committed)
        if rekeying is not None:
            rekeying.committed(self._committer.committed_upstream)
        if self._purge is not None:
            self._purge.committed(committed)
        return True

    def _abort_in_flight(self) -> None:
        """Partitions were lost: abort the transaction holding their records, rewind the others."""
        transactions = self._committer.transactions
        if transactions is not None and transactions.open:
            try:
                transactions.abort()
            except CallTimedOut as timed_out:
                raise self._committer.timed_out(timed_out) from timed_out
            self._rewind()

    def _rewind(self) -> None:
        self.report.transactions_aborted += 1
        self._assignments.rewind(self._consumer)

    def _pass_markers(self) -> None:
        self._progress.pass_markers()

    def _caught_up(self) -> bool:
        """Every held partition processed up to its end; holding none, the whole group caught up. Records
        re-keyed since the last commit are committed first: only then can the repartition topic's end count them."""
        if self._rekeying is not None and self._rekeying.unflushed:
            self._commit()
            return False
        # Cooperative rebalancing assigns in two rounds: an empty first round says little. After
        # that, a worker holding nothing stops only when the group's committed offsets say that
        # nothing is left (partitions lost in a broker outage come back once the group rejoins).
        idle_since = self._assignments.empty_since
        idle = idle_since is not None and time.monotonic() - idle_since >= EMPTY_ASSIGNMENT_GRACE
        return self._progress.caught_up(idle)

    def _close(self, failed: bool) -> None:
        """Close what was opened, in order; a failure while starting leaves some clients unopened.
        The stores are committed (unless the run closes dirty) and closed before the consumer leaves
        the group, so that its revocation has nothing left to do; every client's close is bounded by
        the run's end. A store that fails to close is reported after every other client closed (only
        logged when the run already failed, so that the first error is the one raised)."""
        assignments = getattr(self, "_assignments", None)
        close_error: StateStoreError | None = None
        if assignments is not None:
            assignments.shutting_down = True
            self._commit_before_closing(assignments)
            if self._standbys is not None:
                self._standbys.close(self._close_time())
            try:
                assignments.close_all()
            except StateStoreError as error:
                close_error = error
        for name, what in _CONSUMERS:
            if (client := getattr(self, name, None)) is not None:
                calls = self._consumer_calls if name == "_consumer" else BoundedCalls(what)
                calls.close(f"closing the {what} of {self.config.name!r}", client.close, self._close_time())
        for tables in (getattr(self, name, None) for name in ("_globals", "_tables", "_source_tables", "_streams")):
            if tables is not None:
                tables.close_all(self._close_time())
        committer = getattr(self, "_committer", None)
        if committer is not None:  # last: delivering what is left may take the rest of the time
            committer.close(self._close_time())
        if close_error is not None:
            if not failed:
                raise close_error
            log.error("Closing the stores of %r also failed: %s", self.config.name, close_error)
