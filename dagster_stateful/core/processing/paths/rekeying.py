"""The source side of a re-keying app: its records go, under their new key, to the repartition topic.

Owns `Rekeying`: the source partitions a worker holds when its app re-keys (`group_by`), which keep
no state but the partitioned tables joined before `group_by` (`SourceTables`: opened at a
partition's first record, their positions committed in its offset's metadata), and the path their
messages take: decode the value, point the tables at the record (which must have a key), run the
stateless steps declared before `group_by` (joins among them), compute the new key and
produce the record, with the source record's timestamp, to the repartition topic through the commit
path, so that under exactly-once it belongs to the transaction that also commits the source offset,
and at-least-once it is acknowledged before that offset is committed. A message the codecs, the
steps or the new key refuse goes to the error policy, with its source topic, partition and offset.
`RoutedBatches` sends each run of a consumed batch to its path. The worker commits these
partitions' offsets with the state's (`Committer.commit`), rewinds them when a transaction aborts,
and lets them go on revocation like any other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.processing.dsl.dataframe import StreamingDataFrame
from dagster_stateful.core.processing.dsl.group_by import GroupBy
from dagster_stateful.core.processing.dsl.joins import NO_TABLE_KEY
from dagster_stateful.core.processing.dsl.steps import DROPPED, Chain, StepFailed, StepKind, Views, run_chain
from dagster_stateful.core.processing.paths.bad_input import BadInputHandler
from dagster_stateful.core.state.commit_metadata import decode_commit_metadata, encode_commit_metadata
from dagster_stateful.core.state.participant import Participant
from dagster_stateful.core.state.serialization import JsonSerde, StrSerde, fast_loads

log = logging.getLogger(__name__)

NO_STATES: Views = {}
"""The states of the steps before `group_by`: none (they are stateless)."""

Produce = Callable[[str, bytes | None, bytes | None, None, None, int], None]
"""The commit path's `Committer.produce`: (topic, key, value, headers, partition, timestamp)."""


@dataclass
class SourcePosition:
    """How far one held source partition was committed and processed, and its tables."""

    committed: int | None
    next_offset: int | None = None
    recorded: dict[str, int] = field(default_factory=dict)
    """The entries of its last commit's metadata (the positions of the tables joined before `group_by`)."""
    tables: Participant | None = None
    """Its tables, once opened (at its first record)."""

    @property
    def progressed(self) -> bool:
        return self.next_offset is not None and self.next_offset != self.committed


class SourceTables(Protocol):
    """The partitioned tables joined before `group_by`, kept beside the source partitions
    (`worker.tables.PartitionedTables`)."""

    def open(self, partition: int, recorded: dict[str, int]) -> Participant: ...

    def close(self, partition: int) -> None: ...

    def refresh(self, messages: list[Message], start: int, end: int | None = None) -> None: ...

    def point_at(self, partition: int) -> JoinedRecord | None: ...

    def before(self, partition: int, key: bytes, timestamp: int) -> None: ...


class JoinedRecord(Protocol):
    """The record the tables' joins read (`SourceTables.point_at`)."""

    key: bytes
    timestamp: int


class Rekeying:
    """The source partitions of a re-keying worker, and the processing of their messages."""

    def __init__(
        self,
        config: AppConfig,
        grouping: GroupBy,
        bad_input: BadInputHandler,
        produce: Produce,
        counts: dict[int, int],
        tables: SourceTables | None = None,
    ) -> None:
        """counts: messages processed per source partition, updated in place. tables: the partitioned
        tables joined before `group_by` (None: none), which commit their positions with the source
        offsets, in the commit's metadata."""
        self._tables = tables
        assert config.repartition_topic is not None
        self.topic = config.source
        self.target = config.repartition_topic
        self._grouping = grouping
        self._bad_input = bad_input
        self._produce = produce
        self._key_dumps = config.key_serde.dumps
        self._value_loads = fast_loads(config.value_serde)
        self._value_dumps = config.value_serde.dumps
        self._dumps = orjson.dumps if type(config.value_serde) is JsonSerde else self._value_dumps
        """The value serde's `dumps` (orjson's own for JSON, which the serde calls and nothing more)."""
        self._str_keys = type(config.key_serde) is StrSerde
        """Whether a new key that is a str is encoded as `StrSerde.dumps` does: `str.encode`."""
        self._steps = _steps_of(grouping.before)
        self.counts = counts
        self.positions: dict[int, SourcePosition] = {}
        """The source partitions held, by partition."""
        self.unflushed = 0
        """Records sent to the repartition topic since the last commit."""

    @classmethod
    def of_app(
        cls,
        config: AppConfig,
        dataframe: StreamingDataFrame,
        bad_input: BadInputHandler,
        produce: Produce,
        counts: dict[int, int],
        tables: SourceTables,
    ) -> Rekeying | None:
        """The re-keying of an app whose steps re-key (None for one that does not); `tables`: those
        joined before `group_by` (none when empty)."""
        if dataframe.grouping is None:
            return None
        return cls(config, dataframe.grouping, bad_input, produce, counts, tables if tables else None)

    # Partitions taken and let go.

    def take(self, committed: Iterable[TopicPartition], reset: int | None) -> list[TopicPartition]:
        """Hold these source partitions (`committed`: the group's committed offsets); returns where
        each starts: its committed offset, else `reset` (where `auto.offset.reset` says)."""
        starts = []
        for topic_partition in committed:
            offset = topic_partition.offset if topic_partition.offset >= 0 else None
            where = f"{self.topic}[{topic_partition.partition}]"
            recorded = decode_commit_metadata(topic_partition.metadata, offset, where).stream_times
            self.positions[topic_partition.partition] = SourcePosition(offset, offset, dict(recorded))
            at = topic_partition.offset if offset is not None or reset is None else reset
            starts.append(TopicPartition(self.topic, topic_partition.partition, at))
        if starts:
            log.info(
                "Assigned %s partitions %s (re-keyed to %s)", self.topic, [tp.partition for tp in starts], self.target
            )
        return starts

    def release(self, partitions: Iterable[int]) -> list[int]:
        """Let these partitions go (their progress since the last commit with them); returns those held."""
        released = [partition for partition in partitions if self.positions.pop(partition, None) is not None]
        if self._tables is not None:
            for partition in released:
                self._tables.close(partition)
        if released:
            log.info("Let go of %s partitions %s", self.topic, released)
        return released

    def rewind(self, consumer: Consumer) -> None:
        """Drop what was processed since the last commit: each partition starts again at its committed offset."""
        for partition, held in self.positions.items():
            held.next_offset = held.committed
            if held.tables is not None:
                held.tables.roll_back()
            start = OFFSET_BEGINNING if held.committed is None else held.committed
            consumer.seek(TopicPartition(self.topic, partition, start))
        self.unflushed = 0

    # Committing.

    def offsets_to_commit(self) -> list[TopicPartition]:
        """The offsets of the partitions processed since the last commit, with their tables' positions."""
        return [
            self._offset(partition, held.next_offset, held.tables)
            for partition, held in self.positions.items()
            if held.progressed and held.next_offset is not None
        ]

    def _offset(self, partition: int, offset: int, tables: Participant | None) -> TopicPartition:
        if tables is None:
            return TopicPartition(self.topic, partition, offset)
        metadata = encode_commit_metadata(tables.positions_to_commit(), offset, {})
        return TopicPartition(self.topic, partition, offset, metadata)

    def committed(self, offsets: Iterable[TopicPartition]) -> None:
        for topic_partition in offsets:
            held = self.positions.get(topic_partition.partition)
            if held is not None:
                held.committed = topic_partition.offset
                if held.tables is not None:
                    held.tables.committed()
        self.unflushed = 0

    # Processing.

    def process(self, messages: list[Message], start: int, end: int, budget: int) -> tuple[int, int]:
        """Process `messages[start:end]` (all of this topic) until `budget` of them were; returns the
        index of the next message and how many were processed (or passed by the error policy).
        Messages of partitions no longer held are left alone. Without steps before `group_by`, a
        record goes on with its value's bytes as they came (decoded for its new key only)."""
        if self._tables is not None:
            self._open_tables(messages, start, end)
            self._tables.refresh(messages, start, end)
        index, done = start, 0
        while index < end and done < budget:
            partition: int = messages[index].partition()  # type: ignore[assignment]  # a record's: set
            held = self.positions.get(partition)
            if held is None:
                index += 1
                continue
            ran = self._process_run(messages, index, end, budget - done, partition, held)
            index += ran
            done += ran
        return index, done

    def _process_run(
        self, messages: list[Message], index: int, end: int, budget: int, partition: int, held: SourcePosition
    ) -> int:
        """The hot loop: the messages of `partition` from `index` on, at most `budget` of them;
        returns how many it processed. Counts them, and keeps the partition's next offset, even when
        the error policy or the producer raises."""
        loads, new_key, key_dumps, value_dumps = self._value_loads, self._grouping.new_key, self._key_dumps, self._dumps
        produce, target, tables, steps, str_keys = self._produce, self.target, self._tables, self._steps, self._str_keys
        before = None if tables is None else tables.before
        record = None if tables is None else tables.point_at(partition)
        done = sent = 0
        try:
            while done < budget and index + done < end:
                message = messages[index + done]
                if message.partition() != partition:
                    break
                raw = message.value()
                timestamp = message.timestamp()[1]
                try:
                    if before is not None:
                        key = message.key()
                        if key is None:
                            raise _NoKey
                        if record is not None:  # no table record to apply first: the joins read the record
                            record.key, record.timestamp = key, timestamp
                        else:
                            before(partition, key, timestamp)
                    value = loads(raw) if raw is not None else None
                    if steps is not None:
                        value = steps(value, NO_STATES)
                        if value is DROPPED:
                            raise _Dropped
                    new = new_key(value)
                    new = new.encode() if str_keys and new.__class__ is str else key_dumps(new)
                    encoded = raw if steps is None else value_dumps(value)
                except StepFailed as failure:
                    self._bad_input.handle(message, f"step {failure.step!r}", failure.error)
                except _Dropped:
                    pass
                except _NoKey:
                    self._bad_input.handle(message, "join", ValueError(NO_TABLE_KEY))
                except Exception as error:  # noqa: BLE001 - codec failures are bad input
                    self._bad_input.handle(message, self._stage_of(raw, error), error)
                else:
                    produce(target, new, encoded, None, None, timestamp)
                    sent += 1
                done += 1
        finally:
            if done:
                held.next_offset = messages[index + done - 1].offset() + 1  # type: ignore[operator]  # a record's: set
                self.counts[partition] = self.counts.get(partition, 0) + done
            self.unflushed += sent
        return done

    def _open_tables(self, messages: list[Message], start: int, end: int) -> None:
        """Open the tables of the held partitions of `messages[start:end]` not opened yet, read up
        to what each partition's last commit recorded."""
        assert self._tables is not None
        if all(held.tables is not None for held in self.positions.values()):
            return
        for partition in {message.partition() for message in messages[start:end]}:
            held = self.positions.get(partition)  # type: ignore[arg-type]  # a record's: set
            if held is not None and held.tables is None:
                held.tables = self._tables.open(partition, held.recorded)  # type: ignore[arg-type]

    def _stage_of(self, raw: bytes | None, error: Exception) -> str:
        """What failed for a record: decoding its value, or encoding its new key or value."""
        try:
            if raw is not None:
                self._value_loads(raw)
        except Exception:  # noqa: BLE001 - the value does not decode
            return "deserializing the value"
        return f"group_by {self._grouping.name!r}: serializing the new key or value"


def _steps_of(chain: Chain) -> Callable[[object, Views], object] | None:
    """The steps before `group_by` as one call of (value, states): what they pass on, or DROPPED
    (None: no step). One apply or join is called as it is: its result is what it passes on."""
    if not chain:
        return None
    if len(chain) == 1 and chain[0][0] in (StepKind.APPLY, StepKind.JOIN):
        return chain[0][1]
    return partial(run_chain, chain)


class _Dropped(Exception):
    """A step before `group_by` dropped the record."""


class _NoKey(Exception):
    """A record joining a partitioned table has no message key."""


class BatchPath(Protocol):
    """The path the state's messages take (per message, or in columns)."""

    @property
    def messages_in_columns(self) -> int: ...

    def process(self, messages: list[Message], start: int, budget: int) -> tuple[int, int]: ...


class RoutedBatches:
    """A re-keying worker's batches: runs of the source's messages go to the re-keying, the rest
    (the repartition topic's) to the state's path."""

    def __init__(self, rekeying: Rekeying, state_path: BatchPath) -> None:
        self._rekeying = rekeying
        self._state_path = state_path

    @property
    def messages_in_columns(self) -> int:
        return self._state_path.messages_in_columns

    def process(self, messages: list[Message], start: int, budget: int) -> tuple[int, int]:
        """As `BatchProcessor.process`, over the messages of both topics."""
        source = self._rekeying.topic
        index, end, done = start, len(messages), 0
        while index < end and done < budget:
            topic, clean = messages[index].topic(), messages[index].error() is None
            run_end = index + 1  # a run: one topic's messages, or Kafka's errors (the state's path raises them)
            while run_end < end and messages[run_end].topic() == topic and (messages[run_end].error() is None) == clean:
                run_end += 1
            if topic == source and clean:
                index, ran = self._rekeying.process(messages, index, run_end, budget - done)
            else:
                taken, ran = self._state_path.process(messages[index:run_end], 0, budget - done)
                index += taken
            done += ran
        return index, done
