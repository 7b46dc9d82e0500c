"""Partitioned tables in a worker: table partition N kept beside stream partition N, committed with it.

Owns `PartitionedTables`, the tables (`joins.Table`) the steps join on the message key. The
records that join them are the task's (tables joined after `group_by`, or in an app that does not
re-key), or the source's in a re-keying app (tables joined before `group_by`, whose partitions
`rekeying.Rekeying` holds); "task partition" below means a partition of either. For each
task partition a worker holds, each table's partition of the same number is a `TablePartition`: a
RocksDB database under the app's state directory (`tables/<table>/<partition>`) holding the latest
value of each key (a versioned table: every version kept in its history, `state.versions`), and,
in the same write batch, the offset of the next table record to apply. The table's topic is its
changelog: nothing else is written to Kafka.

**Order.** Before a task record with timestamp T is processed, the table records fetched for its
partition are applied up to the first one later than T, so that the two partitions are taken in
timestamp order as Kafka Streams' task takes them (a table record no later than the stream record
goes first); a versioned table applies every record fetched, since its lookups are as of T anyway.
At the start of each consumed batch, each partition's table is fetched up to the end the table
consumer last heard from the brokers (asked the first time), short of an open transaction's
records, so that what was on the broker when the batch arrived is seen; the batch's keys are
sampled for the co-partitioning check, and the rows they join are read ahead, one multi-get per
table partition, and kept in memory for the batches after (`ROWS_KEPT_BYTES` for all the table
partitions held). A join reads its record's row through the table's reader, bound to the task
partition's tables once per run of its records (`point_at`, `before`).

**Commit.** A table's changes since the last commit stay in memory. Each commit records, in the
task partition's commit metadata (`commit_metadata.table_entry`; for a source partition, in the
metadata of its offset's commit), the offset of the next table
record to apply; once the commit went through, the changes are written with that offset in one
write batch (`Participant.committed`). An aborted or lost commit drops them and reads the table
again from the committed offset, so the table and the task records always agree. On assignment a
table partition behind its committed offset is read up to it; one without local state, or ahead of
it (state from another run), is read again from the topic's beginning to its end, and processing
then applies the records from the committed offset again (applying a record twice changes
nothing).

**Grace.** Records joining a versioned table with a grace (KIP-923) wait, per partition and in
offset order, until the partition's stream time (the newest timestamp read there) reaches their
timestamp plus the grace: table updates arriving late in that time are seen. A waiting record is
not processed, so the partition's committed offset stays before it; a run that stops reads it
again next time. The stream time is committed with the table positions. At most `MAX_WAITING`
records wait per partition: past that the oldest joins early, with a warning.

A table record whose key or value does not decode goes to the error policy, named by the table's
topic, partition and offset.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from itertools import islice
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.bounded import BoundedCalls
from dagster_stateful.core.kafka.clients import SIDE_READER_CONFIG, KafkaClients
from dagster_stateful.core.processing.dsl.joins import Table, record_fault
from dagster_stateful.core.processing.lifecycle import Deadline
from dagster_stateful.core.processing.paths.bad_input import BadInputHandler
from dagster_stateful.core.processing.worker.co_partitioning import PlacementCheck
from dagster_stateful.core.processing.worker.table_partition import (
    NO_TIME,
    JoiningRecord,
    TablePartition,
    position_of,
)
from dagster_stateful.core.processing.worker.task_tables import MAX_WAITING, TaskTables
from dagster_stateful.core.state.commit_metadata import JOIN_STREAM_TIME, table_entry
from dagster_stateful.core.state.directory import TABLES_DIR
from dagster_stateful.errors import RecoveryError

log = logging.getLogger(__name__)

FETCH_BATCH = 10_000
PENDING_LIMIT = 50_000
"""Records fetched ahead of a plain table's application, per partition: past that, fetching waits."""
STABLE_END_AFTER_SECONDS = 0.5
"""Fetching a table's partition up to its end for longer than this asks where a `read_committed`
reader stops (the last stable offset, before an open transaction)."""
ROWS_KEPT_BYTES = 64 * 1024 * 1024
"""About how much memory the table rows kept in memory may take (`TablePartition.rows`), shared
evenly by the table partitions held (the worker's record cache takes 64 MiB too, by default)."""
LOCK_SECONDS = 30.0
"""How long opening a table partition waits for its previous holder on this machine to let it go."""


class PartitionedTables:
    def __init__(
        self,
        tables: Iterable[tuple[Table, int]],
        config: AppConfig,
        kafka: KafkaClients,
        app_dir: Path,
        bad_input: BadInputHandler,
        deadline: Deadline,
        stream_topic: str | None = None,
    ) -> None:
        """tables: each joined table with the join's grace in ms (the same for all). stream_topic:
        the topic whose records join them, partition for partition (the task's topic unless given:
        the source, for tables joined before `group_by`)."""
        joined = list(tables)
        self.stream_topic = stream_topic or config.task_topic
        self._tables = [table for table, _ in joined]
        self.grace_ms = max((grace for _, grace in joined), default=0)
        self._config = config
        self._kafka = kafka
        self._app_dir = app_dir
        self._bad_input = bad_input
        self._deadline = deadline
        self._consumer: Consumer | None = None
        self.tasks: dict[int, TaskTables] = {}
        """Task partition -> its tables."""
        self._by_topic_partition: dict[tuple[str, int], TablePartition] = {}
        self._record = JoiningRecord()
        """The record being processed, which the joins' readers look up."""
        self._pointed: int | None = None
        """The task partition the joins' readers are bound to (None: none yet, or it changed)."""
        self._pointed_held: list[TablePartition] = []
        self.applied = 0
        """Table records applied in this run (again after a roll-back too)."""
        self._placement: PlacementCheck | None = None
        self.released_early = 0
        """Records that joined before their grace passed, to keep the records waiting within `MAX_WAITING`."""
        for table in self._tables:
            table.bind_reader(_no_row)

    def __bool__(self) -> bool:
        return bool(self._tables)

    # Opening and closing with the task partitions.

    def open(self, partition: int, recorded: dict[str, int]) -> TaskTables:
        """Take the tables of stream partition `partition`, read up to what its last commit recorded
        (`recorded`: the commit's metadata entries); returns them, to commit with the partition."""
        self.close(partition)  # a store found damaged opens its partition again
        self._pointed = None
        if self._placement is None:
            partitions = self._kafka.partition_count(self.stream_topic) or 0
            rekeyed = self.stream_topic == self._config.repartition_topic
            self._placement = PlacementCheck(self.stream_topic, partitions, rekeyed)
        held: list[TablePartition] = []
        task = TaskTables(self, partition, held, recorded.get(JOIN_STREAM_TIME, NO_TIME))
        self.tasks[partition] = task
        try:
            for table in self._tables:
                path = self._app_dir / TABLES_DIR / table.name / str(partition)
                table_partition = TablePartition(table, partition, path, self._record)
                stored, newest = table_partition.open(self._deadline.bound(LOCK_SECONDS))
                held.append(table_partition)
                task.by_name[table.name] = table_partition
                self._by_topic_partition[(table.topic, partition)] = table_partition
                self._catch_up(table_partition, stored, newest, recorded.get(table_entry(table.name)))
        except BaseException:
            self.close(partition)
            raise
        return task

    def _catch_up(self, held: TablePartition, stored: int | None, newest: int, committed: int | None) -> None:
        """Bring `held` to the task's last commit (`committed`: the table offset it recorded)."""
        low, high = self._kafka.watermarks(held.table.topic, [held.partition], committed=True)[held.partition]
        where = f"table {held.table.name!r} ({held.table.topic}[{held.partition}])"
        if committed is None:  # the task never committed with this table: it is applied from the start
            if stored is not None:
                held.wipe()
            held.start_at(low, NO_TIME)
            self._assign(held)
            return
        if committed > high:
            log.warning("%s: the committed offset %d is past the topic's end %d (recreated?)", where, committed, high)
            committed = high
        if stored is not None and low <= stored <= committed:
            held.start_at(stored, newest)
            self._assign(held)
            self._read(held, committed)
            return
        log.info(
            "%s: %s; reading it from offset %d to %d, then applying from the committed offset %d again",
            where,
            "no local state" if stored is None else f"the local state is at offset {stored}",
            low,
            high,
            committed,
        )
        held.wipe()
        held.start_at(low, NO_TIME)
        self._assign(held)
        self._read(held, high)
        held.start_at(committed, held.newest)
        self.reposition([held])

    def _read(self, held: TablePartition, until: int) -> None:
        """Apply `held`'s records up to offset `until`, written locally as they come."""
        while held.applied < until:
            if self._deadline.passed():
                raise RecoveryError(
                    f"table {held.table.name!r} ({held.table.topic}[{held.partition}]) was not read up to offset "
                    f"{until} in time (at {held.applied}); check that the brokers answer, or give the run more time"
                )
            self._fetch(0.2)
            while held.pending and position_of(held.pending[0]) < until:
                self._apply(held, held.pending.popleft())
            if held.fetched >= until and not held.pending:
                held.applied = max(held.applied, until)
            held.commit()

    # Fetching.

    def _consumer_of(self) -> Consumer:
        if self._consumer is None:
            self._consumer = self._kafka.consumer({"group.id": self._config.restore_group, **SIDE_READER_CONFIG})
        return self._consumer

    def _assign(self, held: TablePartition) -> None:
        self._consumer_of().incremental_assign([TopicPartition(held.table.topic, held.partition, held.applied)])
        held.paused, held.assigned = False, True

    def reposition(self, partitions: list[TablePartition]) -> None:
        """Fetch these partitions again from what they applied (after a roll-back)."""
        consumer = self._consumer_of()
        consumer.incremental_unassign([held.topic_partition for held in partitions if held.assigned])
        for held in partitions:
            held.fetched = held.applied
            held.pending.clear()
            self._assign(held)

    def _fetch(self, timeout: float) -> None:
        """Take what the table consumer has fetched into the partitions' pending records."""
        consumer = self._consumer_of()
        for message in consumer.consume(FETCH_BATCH, timeout=timeout):
            failure = message.error()
            topic, partition, offset = message.topic() or "", message.partition() or 0, message.offset() or 0
            held = self._by_topic_partition.get((topic, partition))
            if failure is not None:
                if failure.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(failure)
                if held is not None:
                    held.fetched = max(held.fetched, offset)
                continue
            if held is None or offset < held.fetched:
                continue
            held.fetched = offset + 1
            held.pending.append(message)
            if len(held.pending) >= PENDING_LIMIT and not held.paused:
                consumer.pause([held.topic_partition])
                held.paused = True

    def refresh(self, messages: list[Message], start: int, end: int | None = None) -> None:
        """At the start of a batch (`messages[start:end]`, of the stream topic): fetch the tables of
        its partitions up to the ends they have now, as the table consumer last heard them from the
        brokers (asked once, the first time); check where the records' keys are placed
        (`PlacementCheck`) and read the rows they will join, one multi-get per table partition."""
        keys = self._keys_by_task(messages, start, end)
        if not keys:
            return
        consumer = self._consumer_of()
        for partition in keys:
            for held in self.tasks[partition].held:
                _, high = consumer.get_watermark_offsets(held.topic_partition, cached=True) or (0, -1)
                if high < 0:
                    _, high = consumer.get_watermark_offsets(held.topic_partition, timeout=self._deadline.bound(10.0))
                if held.fetched < high and not held.paused:
                    self._fetch_until(held, high)
        self._prefetch(keys)

    def prefetch(self, messages: list[Message], start: int, end: int | None = None) -> None:
        """Read the rows the records of `messages[start:end]` will join, one multi-get per table partition."""
        self._prefetch(self._keys_by_task(messages, start, end))

    def _keys_by_task(self, messages: list[Message], start: int, end: int | None) -> dict[int, list[bytes]]:
        """The message keys of `messages[start:end]` (Kafka's errors left out), by task partition held
        here (one with no keyed record too), sampled for the placement check on the way."""
        keys: dict[int, list[bytes]] = {}
        last, wanted = None, []
        for message in islice(messages, start, end):
            if message.error() is None:
                partition = message.partition()
                if partition != last:
                    last, wanted = partition, keys.setdefault(partition, [])  # type: ignore[arg-type]  # a record's
                key = message.key()
                if key is not None:
                    wanted.append(key)
        for partition in [partition for partition in keys if partition not in self.tasks]:
            del keys[partition]
        if self._placement is not None:
            for partition, wanted in keys.items():
                self._placement.stream_keys(partition, wanted)
        return keys

    def _prefetch(self, keys: dict[int, list[bytes]]) -> None:
        budget = ROWS_KEPT_BYTES // max(1, len(self.tasks) * len(self._tables))
        for partition, wanted in keys.items():
            if wanted:
                for held in self.tasks[partition].held:
                    held.prefetch(wanted, budget)

    def _fetch_until(self, held: TablePartition, high: int) -> None:
        """Fetch `held` up to `high`, or to where a `read_committed` reader must stop short of it (an
        open transaction on the table's topic), as the brokers say once fetching takes a while."""
        started = time.monotonic()
        while held.fetched < high and not held.paused:
            if self._deadline.passed():
                raise RecoveryError(
                    f"table {held.table.name!r} ({held.table.topic}[{held.partition}]) could not be fetched "
                    f"up to offset {high} in time; check that the brokers answer"
                )
            self._fetch(0.1)
            if held.table.versioned:
                self._apply_all(held)
            if time.monotonic() - started > STABLE_END_AFTER_SECONDS:
                stable = self._kafka.watermarks(held.table.topic, [held.partition], committed=True)[held.partition][1]
                high, started = min(high, stable), time.monotonic()

    # Processing.

    def before(self, partition: int, key: bytes, timestamp: int) -> None:
        """A record of task `partition` with `key` and `timestamp` is about to go through the steps:
        apply the table records that come before it, and point the joins at it."""
        record = self._record
        record.key, record.timestamp = key, timestamp
        if partition != self._pointed:
            self._bind_readers(partition)
        for held in self._pointed_held:
            if held.pending:
                self._apply_due(held, timestamp)

    def point_at(self, partition: int) -> JoiningRecord | None:
        """Point the joins at task `partition` for a run of its records. Returns the record they read,
        whose key and timestamp the caller sets for each record, when no table record waits to be
        applied before any of them (None: call `before` for each)."""
        if partition != self._pointed:
            self._bind_readers(partition)
        return None if any(held.pending for held in self._pointed_held) else self._record

    def _bind_readers(self, partition: int) -> None:
        """Bind the joins' readers to task `partition`'s tables (none held: they find no row)."""
        task = self.tasks.get(partition)
        self._pointed, self._pointed_held = partition, [] if task is None else task.held
        for table in self._tables:
            held = None if task is None else task.by_name.get(table.name)
            table.bind_reader(_no_row if held is None else held.row)

    def _apply_due(self, held: TablePartition, timestamp: int) -> None:
        """Apply `held`'s pending records up to `timestamp` (all of them, a versioned table's)."""
        if held.table.versioned:
            self._apply_all(held)
            return
        pending = held.pending
        while pending and pending[0].timestamp()[1] <= timestamp:
            self._apply(held, pending.popleft())
        if held.paused and len(pending) < PENDING_LIMIT // 2:
            self._consumer_of().resume([held.topic_partition])
            held.paused = False

    def _apply_all(self, held: TablePartition) -> None:
        while held.pending:
            self._apply(held, held.pending.popleft())
        if held.paused:
            self._consumer_of().resume([held.topic_partition])
            held.paused = False

    def _apply(self, held: TablePartition, message: Message) -> None:
        offset = position_of(message)
        key, value = message.key(), message.value()
        table = held.table
        fault = record_fault(table, key, value)
        if fault is not None or key is None:
            self._bad_input.handle(message, f"reading table {table.name!r}", fault or ValueError("no key"))
            held.skip(offset)
            return
        if self._placement is not None:
            self._placement.table_record(table.topic, held.partition, key)
        held.apply(key, value, offset, message.timestamp()[1])
        self.applied += 1

    def hold(self, message: Message) -> bool:
        """Hold a record of a join with a grace until its grace passed (False: its partition is not
        held here); the records of its partition whose grace has passed move to its `released`."""
        task = self.tasks.get(message.partition() or 0)
        if task is None:
            return False
        if task.hold(message, self.grace_ms):
            self.released_early += 1
            if self.released_early == 1:
                log.warning(
                    "%s[%d] holds more than %d records waiting for the grace of %d ms: the oldest join before "
                    "their grace has passed (a table update later than that is missed). Shorten the grace, or "
                    "give the partition fewer records per grace period",
                    self.stream_topic,
                    task.partition,
                    MAX_WAITING,
                    self.grace_ms,
                )
        return True

    def released(self) -> TaskTables | None:
        """A task partition with records released and not processed yet (None: none has)."""
        return next((task for task in self.tasks.values() if task.released), None)

    def first_waiting(self, partition: int) -> int | None:
        """The offset of the first record of task `partition` waiting for its grace (None: none waits)."""
        task = self.tasks.get(partition)
        return None if task is None else task.first_waiting()

    def close(self, partition: int) -> None:
        task = self.tasks.pop(partition, None)
        if task is None:
            return
        self._pointed = None
        for held in task.held:
            self._by_topic_partition.pop((held.table.topic, partition), None)
            held.close()
        assigned = [held.topic_partition for held in task.held if held.assigned]
        if self._consumer is not None and assigned:
            self._consumer.incremental_unassign(assigned)

    def close_all(self, seconds: float) -> None:
        for partition in list(self.tasks):
            self.close(partition)
        for table in self._tables:
            table.bind_reader(None)
        self._pointed = None
        if self._consumer is not None:
            what = f"closing the tables' consumer of {self._config.name!r}"
            BoundedCalls("tables' consumer").close(what, self._consumer.close, seconds)
            self._consumer = None


def _no_row() -> None:
    """The reader of a table whose partition is not held for the record being processed."""
    return None
