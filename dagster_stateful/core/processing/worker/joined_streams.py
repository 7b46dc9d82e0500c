"""The joined stream of a join with another stream in a worker: its partition N read beside task partition N.

Owns `JoinedStreams`. For each task partition a worker holds, the joined stream's partition of the
same number is a `StreamSide`: fetched by a consumer of its own (assigned, outside the group,
`read_committed`), from the offset the task's last commit recorded for it (the metadata entry
`stream:<name>`), or, the first time, from where `auto.offset.reset` says. Its records are units
of work of the task partition, as timer firings are: each runs through the join's right call (an
interval join's, `dsl.interval_joins`, or a table join's, `dsl.table_table_joins`) and
the steps after the join in the partition's transaction (its state writes tagged with the offset
of the task's last message), and its results go to the output topic, so that under exactly-once
they commit, with the stream's position, in the task's transaction; at-least-once the position is
committed after what they sent was acknowledged.

**Order.** The two partitions are taken in timestamp order, as a Kafka Streams task takes them:
before a task record at T, the joined stream's records up to T are processed, and when none is
fetched past T and the stream's partition is not known to be at its end, more is fetched first, so
that a backlog on one side never makes the other's records late. Once the task partition is at its
end (its position at the end the consumer last heard of), the stream's fetched records are
processed from the worker's loop (`on_wall_clock`). A bounded run is caught up only once every
held stream partition was processed to its end too.

A record without a key, or whose key or value does not decode, goes to the error policy with the stream's
topic, partition and offset; so does one late for the join (`handle_late`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, Message, TopicPartition

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.bounded import BoundedCalls
from dagster_stateful.core.kafka.clients import SIDE_READER_CONFIG, KafkaClients
from dagster_stateful.core.processing.dsl.dataframe import StreamingDataFrame
from dagster_stateful.core.processing.dsl.foreign_key_joins import ForeignKeyJoin
from dagster_stateful.core.processing.dsl.interval_joins import StreamJoin
from dagster_stateful.core.processing.dsl.steps import Chain, StepFailed, through
from dagster_stateful.core.processing.lifecycle import Deadline
from dagster_stateful.core.processing.paths.bad_input import BadInputHandler
from dagster_stateful.core.processing.worker.foreign_key_joins import ForeignKeyJoins
from dagster_stateful.core.processing.worker.global_tables import GlobalTables
from dagster_stateful.core.state.commit_metadata import stream_entry
from dagster_stateful.core.state.interval_join_state import IntervalJoinState
from dagster_stateful.core.state.serialization import BytesSerde, fast_loads
from dagster_stateful.core.state.table_join_state import ENDED, TableJoinState
from dagster_stateful.core.state.transaction import PartitionTransaction
from dagster_stateful.errors import RecoveryError

log = logging.getLogger(__name__)

FETCH_BATCH = 10_000
PENDING_LIMIT = 50_000
"""Records fetched ahead per stream partition: past that, fetching that partition pauses."""
FETCH_WAIT_SECONDS = 0.2
NO_KEY = "a record of a joined stream needs a message key (the join's key)"

Produce = Callable[[str, bytes | None, bytes | None], None]


@dataclass(eq=False)
class StreamSide:
    """The joined stream's partition beside one task partition: a participant in its commits."""

    entry: str
    topic_partition: TopicPartition
    committed_position: int | None
    position: int
    """The offset of the next record to process."""
    owner: JoinedStreams
    pending: deque[Message] = field(default_factory=deque)
    fetched: int = 0
    """The offset of the next record to fetch."""
    at_end: bool = False
    """Fetching met the partition's end (for a `read_committed` reader) and nothing after it since."""
    paused: bool = False
    last_timestamp: int = -1
    """The timestamp of the last record fetched (-1: none since the partition was last positioned)."""

    @property
    def needs_commit(self) -> bool:
        return self.position != self.committed_position

    def positions_to_commit(self) -> dict[str, int]:
        return {self.entry: self.position}

    def committed_positions(self) -> dict[str, int]:
        return {} if self.committed_position is None else {self.entry: self.committed_position}

    def committed(self) -> None:
        self.committed_position = self.position

    def roll_back(self) -> None:
        if self.committed_position is not None:
            self.position = self.committed_position
        self.owner.reposition(self)


class JoinedStreams:
    """The joined stream's partitions beside the task partitions a worker holds, and their processing."""

    def __init__(
        self,
        stream_join: StreamJoin,
        after: Chain,
        config: AppConfig,
        kafka: KafkaClients,
        bad_input: BadInputHandler,
        produce: Produce,
        deadline: Deadline,
        task_ends: Callable[[int, int], bool],
    ) -> None:
        """after: the steps after the join; task_ends(partition, next offset): whether that offset
        is the task partition's end, as the worker's consumer last heard it."""
        self._join = stream_join
        self._after = after
        self._topic = stream_join.stream.topic
        self._entry = stream_entry(stream_join.stream.name)
        self._loads = fast_loads(stream_join.stream.value_serde)
        self._key_check = None if type(config.key_serde) is BytesSerde else fast_loads(config.key_serde)
        """Decodes a record's key as the app's own keys are (the join compares the keys' bytes)."""
        self._config = config
        self._kafka = kafka
        self._bad_input = bad_input
        self._produce = produce
        self._output = config.output if config.emits_output else None
        self._dumps = config.output_serde.dumps
        self._deadline = deadline
        self._task_ends = task_ends
        self._consumer: Consumer | None = None
        self.sides: dict[int, StreamSide] = {}
        self.processed = 0
        """Records of the joined stream processed in this run (again after a roll-back too)."""

    # Opening and closing with the task partitions.

    def open(self, partition: int, recorded: dict[str, int]) -> StreamSide:
        """Take the stream's partition beside task `partition`, from where its last commit recorded."""
        self.close(partition)  # provisioning checked that the topics are co-partitioned
        committed = recorded.get(self._entry)
        if committed is None:
            low, high = self._kafka.watermarks(self._topic, [partition], committed=True)[partition]
            latest = self._config.consumer_config.get("auto.offset.reset") in ("latest", "largest", "end")
            start = high if latest else low
        else:
            start = committed
        side = StreamSide(self._entry, TopicPartition(self._topic, partition), committed, start, self)
        self.sides[partition] = side
        self._assign(side)
        return side

    def _consumer_of(self) -> Consumer:
        if self._consumer is None:
            self._consumer = self._kafka.consumer({"group.id": self._config.restore_group, **SIDE_READER_CONFIG})
        return self._consumer

    def _assign(self, side: StreamSide) -> None:
        side.fetched, side.at_end, side.paused = side.position, False, False
        side.pending.clear()
        at = side.position if side.position >= 0 else OFFSET_END
        self._consumer_of().incremental_assign([TopicPartition(self._topic, side.topic_partition.partition, at)])

    def reposition(self, side: StreamSide) -> None:
        """Fetch `side` again from its position (after a roll-back)."""
        if self.sides.get(side.topic_partition.partition) is side:
            self._consumer_of().incremental_unassign([side.topic_partition])
            self._assign(side)

    def close(self, partition: int) -> None:
        side = self.sides.pop(partition, None)
        if side is not None and self._consumer is not None:
            self._consumer.incremental_unassign([side.topic_partition])

    def close_all(self, seconds: float) -> None:
        for partition in list(self.sides):
            self.close(partition)
        if self._consumer is not None:
            what = f"closing the joined stream's consumer of {self._config.name!r}"
            BoundedCalls("joined stream's consumer").close(what, self._consumer.close, seconds)
            self._consumer = None

    # Fetching.

    def _fetch(self, timeout: float) -> None:
        consumer = self._consumer_of()
        for message in consumer.consume(FETCH_BATCH, timeout=timeout):
            failure = message.error()
            side = self.sides.get(message.partition() or 0)
            offset = message.offset() or 0
            if failure is not None:
                if failure.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(failure)
                if side is not None and offset == side.fetched:  # not one of a pause's purged fetches
                    side.at_end = True
                continue
            if side is None or offset < side.fetched:
                continue
            side.fetched, side.at_end, side.last_timestamp = offset + 1, False, message.timestamp()[1]
            side.pending.append(message)
            if len(side.pending) >= PENDING_LIMIT and not side.paused:
                consumer.pause([side.topic_partition])
                side.paused = True

    def _fetch_past(self, side: StreamSide, timestamp: int) -> None:
        """Fetch until `side` holds a record later than `timestamp`, or is at its end."""
        while not side.at_end and not side.paused and not _holds_later(side, timestamp):
            if self._deadline.passed():
                raise RecoveryError(
                    f"{self._topic}[{side.topic_partition.partition}] could not be fetched in time (at offset "
                    f"{side.fetched}); check that the brokers answer"
                )
            self._fetch(FETCH_WAIT_SECONDS)

    # Processing.

    def before(self, txn: PartitionTransaction, timestamp: int, offset: int) -> None:
        """The task record at `offset` and `timestamp` comes next in `txn`'s partition: process the
        stream's records up to it first."""
        side = self.sides.get(txn.partition)
        if side is None:
            return
        if txn.next_offset is None:
            txn.next_offset = offset  # the partition's first record: where it is committed from
        if not _holds_later(side, timestamp):
            self._fetch_past(side, timestamp)
        pending = side.pending
        while pending and pending[0].timestamp()[1] <= timestamp:
            self._process(txn, side, pending.popleft())
        self._resume(side)

    def on_wall_clock(self, transactions: Iterable[PartitionTransaction]) -> int:
        """Fetch, and process the stream's fetched records of the task partitions at their end."""
        if not self.sides:
            return 0
        self._fetch(0.0)
        done = 0
        for txn in transactions:
            side = self.sides.get(txn.partition)
            if side is None or not side.pending or txn.next_offset is None:
                continue
            if not self._task_ends(txn.partition, txn.next_offset):
                continue
            while side.pending:
                self._process(txn, side, side.pending.popleft())
                done += 1
            self._resume(side)
        return done

    def caught_up(self, transactions: Mapping[int, PartitionTransaction]) -> bool:
        """Whether every held stream partition was processed up to its end, as the brokers say it now."""
        self._fetch(0.0)
        held = {partition: side for partition, side in self.sides.items() if partition in transactions}
        if not all(side.at_end and not side.pending for side in held.values()):
            return False
        ends = self._kafka.watermarks(self._topic, list(held), committed=True)
        return all(side.position >= ends[partition][1] for partition, side in held.items())

    def _resume(self, side: StreamSide) -> None:
        if side.paused and len(side.pending) < PENDING_LIMIT // 2:
            self._consumer_of().resume([side.topic_partition])
            side.paused = False

    def _process(self, txn: PartitionTransaction, side: StreamSide, message: Message) -> None:
        """One record of the stream, as a unit of work of the task partition."""
        assert txn.next_offset is not None
        offset: int = message.offset()  # type: ignore[assignment]  # a record's: set
        key, raw = message.key(), message.value()
        tag = txn.next_offset - 1
        self.processed += 1
        if key is None:
            self._reject(side, message, "interval join", ValueError(NO_KEY))
            return
        try:
            if self._key_check is not None:
                self._key_check(key)
            value = self._loads(raw) if raw is not None else None
        except Exception as error:  # noqa: BLE001 - any codec failure is bad input
            stage = f"deserializing the key or value of joined stream {self._join.stream.name!r}"
            self._reject(side, message, stage, self._described(key, raw, error))
            return
        txn.begin_message(key, tag)
        state: IntervalJoinState | TableJoinState = txn.windows[self._join.store]  # type: ignore[assignment]
        state.timestamp, state.right_offset = message.timestamp()[1], offset
        try:
            emitted = through(self._join.right(value, txn.views), self._after, txn.views)
        except StepFailed as failure:
            txn.discard_message()
            self._reject(side, message, f"step {failure.step!r}", failure.error)
            return
        txn.accept_message(tag)
        side.position = offset + 1
        if emitted.late:
            self._bad_input.handle_late(message, state.stream_time)
        elif self._output is not None:
            for result_key, result in emitted:
                self._produce(self._output, result_key, None if result is ENDED else self._dumps(result))

    def _described(self, key: bytes, raw: bytes | None, error: Exception) -> Exception:
        """The serdes' own error for a record the fast decoders refused (theirs are terser)."""
        try:
            self._config.key_serde.loads(key)
            if raw is not None:
                self._join.stream.value_serde.loads(raw)
        except Exception as described:  # noqa: BLE001 - reported as the record's failure
            return described
        return error

    def _reject(self, side: StreamSide, message: Message, stage: str, error: BaseException) -> None:
        self._bad_input.handle(message, stage, error)
        side.position = (message.offset() or 0) + 1


def _holds_later(side: StreamSide, timestamp: int) -> bool:
    """Whether `side` has fetched a record later than `timestamp` (its records come in offset order)."""
    return bool(side.pending) and side.last_timestamp > timestamp


def task_at_end(consumer: Consumer, topic: str) -> Callable[[int, int], bool]:
    """Whether an offset is the end of a task partition, as the worker's consumer last heard it."""

    def at_end(partition: int, next_offset: int) -> bool:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True) or (0, -1)
        return high >= 0 and next_offset >= high

    return at_end


def joined_streams(
    config: AppConfig,
    dataframe: StreamingDataFrame,
    kafka: KafkaClients,
    bad_input: BadInputHandler,
    produce: Produce,
    deadline: Deadline,
    consumer: Consumer,
    global_tables: GlobalTables,
) -> JoinedStreams | ForeignKeyJoins | None:
    """What feeds the other side of an app's join with a stream or a table beside the task
    partitions: the joined stream's partitions, or a foreign-key join's right table (None: neither)."""
    stream_join = dataframe.stream_join
    if stream_join is None:
        return None
    after = dataframe.stream_join_after
    if isinstance(stream_join.join, ForeignKeyJoin):
        return ForeignKeyJoins(stream_join, after, config, kafka, bad_input, produce, deadline, global_tables)
    ends = task_at_end(consumer, config.task_topic)
    return JoinedStreams(stream_join, after, config, kafka, bad_input, produce, deadline, ends)
