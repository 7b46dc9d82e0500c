"""Global tables in a worker: every partition of each table's topic, kept whole on this machine.

Owns `GlobalTables`. Each global table (`joins.GlobalTable`) has a local copy: a RocksDB database
under the app's state directory (`global-tables/<table>/<member>`), holding the latest value of each
key and, in the same write batch, the offset it has read to in each partition. Before the worker
joins its group (as Kafka Streams bootstraps its global stores before its stream threads start), the
copy reads its topic from where it stopped up to the end the topic had then; while processing,
what has arrived is applied between consumed batches, so a record sees the table as of then. A
tombstone deletes its key. A record whose key or value does not decode goes to the error policy,
named by the table's topic, partition and offset. A foreign-key join (`worker.foreign_key_joins`)
subscribes to its table: it is told of each batch of records applied to the copy, and can read
the copy up to a position. A copy whose offsets lie past the topic's end
(the topic was recreated) is read again from the beginning. The table consumer is assigned its
partitions and never joins a group.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.bounded import BoundedCalls
from dagster_stateful.core.kafka.clients import SIDE_READER_CONFIG, KafkaClients
from dagster_stateful.core.kafka.records import position
from dagster_stateful.core.processing.dsl.joins import GlobalTable, record_fault
from dagster_stateful.core.processing.lifecycle import Deadline
from dagster_stateful.core.processing.paths.bad_input import BadInputHandler
from dagster_stateful.core.state.directory import GLOBAL_TABLES_DIR
from dagster_stateful.core.state.rocksdb import PartitionDatabase
from dagster_stateful.errors import RecoveryError

log = logging.getLogger(__name__)

OFFSETS_KEY = b"offsets"
BATCH = 10_000

Applied = Callable[[list[Message], dict[int, int]], None]
"""Told of records applied to a table's copy: the records, and the copy's position after them."""


class TableCopy:
    """One global table's local copy, and how far it has read each partition."""

    def __init__(self, table: GlobalTable, path: Path) -> None:
        self.table = table
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self.database = PartitionDatabase(path, store=f"global table {table.name}")
        stored = self.database.get_meta(OFFSETS_KEY)
        self.offsets: dict[int, int] = {int(p): o for p, o in orjson.loads(stored).items()} if stored else {}
        """Partition -> the offset of the next record to read."""

    def wipe(self) -> None:
        self.database.close()
        shutil.rmtree(self.path)
        self.path.mkdir(parents=True)
        self.database = PartitionDatabase(self.path, store=f"global table {self.table.name}")
        self.offsets = {}

    def apply(self, changes: list[tuple[bytes, bytes | None]], offsets: dict[int, int]) -> None:
        self.offsets.update(offsets)
        meta = {OFFSETS_KEY: orjson.dumps({str(p): o for p, o in self.offsets.items()})}
        self.database.write(changes, meta)


class GlobalTables:
    def __init__(
        self,
        tables: Iterable[GlobalTable],
        config: AppConfig,
        kafka: KafkaClients,
        app_dir: Path,
        bad_input: BadInputHandler,
    ) -> None:
        self._tables = {table.topic: table for table in tables}
        self._config = config
        self._kafka = kafka
        self._member = config.group_instance_id or "worker"
        self._app_dir = app_dir
        self._bad_input = bad_input
        self._copies: dict[str, TableCopy] = {}
        self._consumer: Consumer | None = None
        self._partitions: dict[str, int] = {}
        self._subscribers: dict[str, Applied] = {}
        self.applied = 0
        """Table records applied in this run."""

    def __bool__(self) -> bool:
        return bool(self._tables)

    def bootstrap(self, deadline: Deadline) -> None:
        """Open each table's copy and read its topic up to the end it has now."""
        if not self._tables:
            return
        started = time.monotonic()
        ends: dict[tuple[str, int], int] = {}
        starts: list[TopicPartition] = []
        for topic, table in self._tables.items():
            copy = TableCopy(table, self._app_dir / GLOBAL_TABLES_DIR / table.name / self._member)
            self._copies[topic] = copy
            table.bind_reader(copy.database.get)
            count = self._partitions[topic] = self._kafka.partition_count(topic) or 0
            marks = self._kafka.watermarks(topic, range(count))
            if any(copy.offsets.get(p, 0) > high for p, (_, high) in marks.items()):
                log.warning(
                    "Global table %r holds offsets past the end of %s (recreated?): reading it again", table.name, topic
                )
                copy.wipe()
            for partition, (_, high) in marks.items():
                at = copy.offsets.get(partition)
                starts.append(TopicPartition(topic, partition, OFFSET_BEGINNING if at is None else at))
                if high > (at or 0):
                    ends[(topic, partition)] = high
        self._consumer = self._kafka.consumer({"group.id": self._config.restore_group, **SIDE_READER_CONFIG})
        self._consumer.assign(starts)
        while ends:
            if deadline.passed():
                raise RecoveryError(
                    f"the global tables of app {self._config.name!r} were not read to their ends in time: "
                    f"{sorted(f'{t}[{p}]' for t, p in ends)} left; check that the brokers answer, or give the run "
                    "more time"
                )
            for topic_partition in self._apply(self._consumer.consume(BATCH, timeout=0.2)):
                if topic_partition.offset >= ends.get((topic_partition.topic, topic_partition.partition), 0):
                    ends.pop((topic_partition.topic, topic_partition.partition), None)
        log.info(
            "Read global tables %s of app %r to their ends (%d records, %.1f s)",
            sorted(table.name for table in self._tables.values()),
            self._config.name,
            self.applied,
            time.monotonic() - started,
        )

    def subscribe(self, topic: str, applied: Applied) -> None:
        """Call `applied` with each batch of records of `topic` applied to its copy from now on."""
        self._subscribers[topic] = applied

    def position(self, topic: str) -> dict[int, int]:
        """Where the copy of `topic`'s table stands: partition -> the offset of the next record to read."""
        offsets = self._copies[topic].offsets
        return {partition: offsets.get(partition, 0) for partition in range(self._partitions[topic])}

    def read_to(self, topic: str, wanted: dict[int, int], deadline: Deadline) -> None:
        """Read `topic`'s table until its copy stands at `wanted` or past it, in every partition."""
        while any(self.position(topic).get(partition, 0) < offset for partition, offset in wanted.items()):
            if deadline.passed():
                raise RecoveryError(
                    f"global table {self._tables[topic].name!r} was not read to {wanted} of {topic} in time (at "
                    f"{self.position(topic)}); check that the brokers answer, or give the run more time"
                )
            assert self._consumer is not None
            self._apply(self._consumer.consume(BATCH, timeout=0.2))

    def poll(self) -> None:
        """Apply what has arrived on the tables' topics (without waiting)."""
        if self._consumer is not None:
            self._apply(self._consumer.consume(BATCH, timeout=0))

    def _apply(self, messages: list[Message]) -> list[TopicPartition]:
        """Apply `messages` to their copies; returns where each partition they touched stands now
        (from each record, and from end-of-partition events)."""
        reached: list[TopicPartition] = []
        changes: dict[str, list[tuple[bytes, bytes | None]]] = {}
        offsets: dict[str, dict[int, int]] = {}
        good: dict[str, list[Message]] = {}
        for message in messages:
            failure = message.error()
            if failure is not None:
                if failure.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(failure)
                reached.append(TopicPartition(message.topic() or "", message.partition() or 0, message.offset() or 0))
                continue
            topic, partition, offset = position(message)
            offsets.setdefault(topic, {})[partition] = offset + 1
            reached.append(TopicPartition(topic, partition, offset + 1))
            key, value = message.key(), message.value()
            table = self._tables[topic]
            fault = record_fault(table, key, value)
            if fault is not None or key is None:
                self._bad_input.handle(message, f"reading global table {table.name!r}", fault or ValueError("no key"))
                continue
            changes.setdefault(topic, []).append((key, value))
            good.setdefault(topic, []).append(message)
        for topic, read in offsets.items():
            self._copies[topic].apply(changes.get(topic, []), read)
            self.applied += len(changes.get(topic, []))
            subscriber = self._subscribers.get(topic)
            if subscriber is not None:
                subscriber(good.get(topic, []), self.position(topic))
        return reached

    def close_all(self, seconds: float) -> None:
        """Close the copies, and the table consumer within `seconds` (or in the background)."""
        for table in self._tables.values():
            table.bind_reader(None)
        if self._consumer is not None:
            what = f"closing the global tables' consumer of {self._config.name!r}"
            BoundedCalls("global tables' consumer").close(what, self._consumer.close, seconds)
            self._consumer = None
        for copy in self._copies.values():
            copy.database.close()
        self._copies = {}
