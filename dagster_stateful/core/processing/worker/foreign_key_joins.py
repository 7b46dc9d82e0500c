"""The right table of a foreign-key join in a worker: its updates run through every task partition held.

Owns `ForeignKeyJoins`. The right table is a global table (`worker.global_tables`): the worker
keeps it whole and reads it between batches. Each task partition it holds has a
`RightTablePosition`, the offsets of the right table's records (per partition of its topic) that
the partition's join state has taken in, committed in the task's commit metadata (entries
`fk:<table>:<partition>`) and so atomically with its state and offset. When the copy applies
records, each held task partition runs them (the latest per right key, with the copy's value then)
through the join's right call and the steps after the join as units of work of the partition, as
a joined stream's records are (`worker.joined_streams`): before its next record, or from the
worker's loop. So a left record is always joined with the copy as the partition has taken it in,
and what a right update sends commits with the partition's position in the right table.

A partition taken up, or rolled back, with a position behind the copy's reads the right table's
records between the two again (any compacted away were replaced by later records of their keys,
which it reads or the copy applies later) and runs their keys; one ahead of the copy (committed by
a worker whose copy had read further) first reads the copy up to it. A bounded run is caught up
once the copy has read the right topic to its end and every held partition has taken it all in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.bounded import BoundedCalls
from dagster_stateful.core.kafka.clients import SIDE_READER_CONFIG, KafkaClients
from dagster_stateful.core.processing.dsl.foreign_key_joins import ForeignKeyJoin
from dagster_stateful.core.processing.dsl.interval_joins import StreamJoin
from dagster_stateful.core.processing.dsl.joins import record_fault
from dagster_stateful.core.processing.dsl.steps import Chain, StepFailed, through
from dagster_stateful.core.processing.lifecycle import Deadline
from dagster_stateful.core.processing.paths.bad_input import BadInputHandler
from dagster_stateful.core.processing.worker.global_tables import GlobalTables
from dagster_stateful.core.state.commit_metadata import check_metadata_fits, foreign_key_entry
from dagster_stateful.core.state.foreign_key_join_state import ForeignKeyJoinState
from dagster_stateful.core.state.table_join_state import ENDED
from dagster_stateful.core.state.transaction import PartitionTransaction
from dagster_stateful.errors import ConfigurationError, RecoveryError

log = logging.getLogger(__name__)

READ_BATCH = 10_000

Produce = Callable[[str, bytes | None, bytes | None], None]


@dataclass(eq=False)
class RightTablePosition:
    """How far one task partition's join state has taken in the right table: a participant in its commits."""

    partition: int
    entries: dict[int, str]
    """Right partition -> its entry in the commit metadata."""
    committed_position: dict[int, int] | None
    position: dict[int, int]
    """Right partition -> the offset of the next record the state has not taken in."""
    target: dict[int, int]
    """Where the copy stands (what the state takes in next)."""
    owner: ForeignKeyJoins
    pending: dict[bytes, Message] = field(default_factory=dict)
    """Right key -> its latest record between `position` and `target` (when `known`)."""
    known: bool = True
    """`pending` holds every key updated between `position` and `target` (else they are read again)."""

    @property
    def behind(self) -> bool:
        return self.position != self.target

    @property
    def needs_commit(self) -> bool:
        return self.position != self.committed_position

    def positions_to_commit(self) -> dict[str, int]:
        return {self.entries[partition]: offset for partition, offset in self.position.items()}

    def committed_positions(self) -> dict[str, int]:
        if self.committed_position is None:
            return {}
        return {self.entries[partition]: offset for partition, offset in self.committed_position.items()}

    def committed(self) -> None:
        self.committed_position = dict(self.position)

    def roll_back(self) -> None:
        self.pending.clear()
        if self.committed_position is not None:
            self.position = dict(self.committed_position)
            self.known = not self.behind
        else:  # never committed: the state rolled back holds no row that an update changes
            self.position = dict(self.target)


class ForeignKeyJoins:
    """The right table's updates, run through the join state of each task partition a worker holds."""

    def __init__(
        self,
        stream_join: StreamJoin,
        after: Chain,
        config: AppConfig,
        kafka: KafkaClients,
        bad_input: BadInputHandler,
        produce: Produce,
        deadline: Deadline,
        global_tables: GlobalTables,
    ) -> None:
        """after: the steps after the join; global_tables: the worker's, which keep the right table."""
        join: ForeignKeyJoin = stream_join.join
        self._join = stream_join
        self._table = join.table
        self._topic = join.table.topic
        self._after = after
        self._config = config
        self._kafka = kafka
        self._bad_input = bad_input
        self._produce = produce
        self._output = config.output if config.emits_output else None
        self._dumps = config.output_serde.dumps
        self._deadline = deadline
        self._globals = global_tables
        self._consumer: Consumer | None = None
        self.sides: dict[int, RightTablePosition] = {}
        self.processed = 0
        """Right keys run through a task partition's join state in this run (again after a roll-back too)."""
        global_tables.subscribe(self._topic, self._applied)

    # Opening and closing with the task partitions.

    def open(self, partition: int, recorded: dict[str, int]) -> RightTablePosition:
        """Take up task `partition` at the position in the right table its last commit recorded."""
        copy = self._globals.position(self._topic)
        entries = {right: foreign_key_entry(self._table.name, right) for right in copy}
        if not self.sides:
            self._check_fits(entries)
        committed = None
        if any(entry in recorded for entry in entries.values()):
            committed = {right: recorded.get(entry, 0) for right, entry in entries.items()}
            if any(offset > copy[right] for right, offset in committed.items()):
                self._globals.read_to(self._topic, committed, self._deadline)
                copy = self._globals.position(self._topic)
        start = dict(copy) if committed is None else dict(committed)
        side = RightTablePosition(partition, entries, committed, start, dict(copy), self)
        side.known = not side.behind
        self.sides[partition] = side
        return side

    def _check_fits(self, entries: dict[int, str]) -> None:
        try:
            check_metadata_fits([self._join.store, *entries.values()])
        except ConfigurationError as error:
            raise ConfigurationError(
                f"the foreign-key join's positions in the {len(entries)} partitions of {self._topic} do not fit in "
                f"a commit's metadata ({error})"
            ) from error

    def close(self, partition: int) -> None:
        self.sides.pop(partition, None)

    def close_all(self, seconds: float) -> None:
        self.sides.clear()
        if self._consumer is not None:
            what = f"closing the foreign-key join's consumer of {self._config.name!r}"
            BoundedCalls("foreign-key join's consumer").close(what, self._consumer.close, seconds)
            self._consumer = None

    def _applied(self, records: list[Message], position: dict[int, int]) -> None:
        """The copy applied `records` and now stands at `position`."""
        for side in self.sides.values():
            if side.known:
                for record in records:
                    side.pending.pop(record.key(), None)  # type: ignore[arg-type]  # applied: keyed
                    side.pending[record.key()] = record  # type: ignore[index]  # applied: keyed
            side.target = dict(position)

    # Processing.

    def before(self, txn: PartitionTransaction, timestamp: int, offset: int) -> None:
        """The task record at `offset` comes next in `txn`'s partition: take in the right table first."""
        side = self.sides.get(txn.partition)
        if side is None:
            return
        if txn.next_offset is None:
            txn.next_offset = offset  # the partition's first record: where it is committed from
        if side.behind:
            self._take_in(txn, side)

    def on_wall_clock(self, transactions: Iterable[PartitionTransaction]) -> int:
        """Take in the right table in every held task partition behind the copy."""
        done = 0
        for txn in transactions:
            side = self.sides.get(txn.partition)
            if side is None or not side.behind:
                continue
            if txn.next_offset is None:
                if self._state(txn).references:
                    continue  # rows restored before any commit: taken in once the partition's first record tags them
                side.position, side.known = dict(side.target), True
                side.pending.clear()
                continue
            done += self._take_in(txn, side)
        return done

    def caught_up(self, transactions: Mapping[int, PartitionTransaction]) -> bool:
        """Whether the copy has read the right topic to its end, as the brokers say it now, and every
        held task partition has taken it all in."""
        self._globals.poll()
        copy = self._globals.position(self._topic)
        ends = self._kafka.watermarks(self._topic, list(copy), committed=True)
        if any(copy[right] < high for right, (_, high) in ends.items()):
            return False
        return all(not side.behind for partition, side in self.sides.items() if partition in transactions)

    def _state(self, txn: PartitionTransaction) -> ForeignKeyJoinState:
        return txn.windows[self._join.store]  # type: ignore[return-value]  # the join's store

    def _take_in(self, txn: PartitionTransaction, side: RightTablePosition) -> int:
        if not side.known:
            side.pending = self.updated_between(side.position, side.target)
            side.known = True
        records = list(side.pending.values())
        side.pending.clear()
        for record in records:
            self._process(txn, record)
        side.position = dict(side.target)
        return len(records)

    def _process(self, txn: PartitionTransaction, record: Message) -> None:
        """One right key's latest record, as a unit of work of the task partition."""
        assert txn.next_offset is not None
        raw_key, raw = record.key(), record.value()
        assert raw_key is not None  # the copy applies keyed records only
        table = self._table
        right_key = table.key_serde.dumps(table.key_serde.loads(raw_key))
        value = None if raw is None else table.value_serde.loads(raw)
        tag = txn.next_offset - 1
        self.processed += 1
        txn.begin_message(right_key, tag)
        try:
            emitted = through(self._join.right((right_key, value), txn.views), self._after, txn.views)
        except StepFailed as failure:
            txn.discard_message()
            stage = f"step {failure.step!r} for an update of table {table.name!r}"
            self._bad_input.handle(record, stage, failure.error)
            return
        txn.accept_message(tag)
        if self._output is not None:
            for result_key, result in emitted:
                self._produce(self._output, result_key, None if result is ENDED else self._dumps(result))

    def updated_between(self, start: dict[int, int], end: dict[int, int]) -> dict[bytes, Message]:
        """The latest record of each right key the right topic holds from `start` up to `end` (the
        records the copy applied; those it refused are passed by again)."""
        wanted = {right: offset for right, offset in end.items() if offset > start.get(right, 0)}
        latest: dict[bytes, Message] = {}
        if not wanted:
            return latest
        consumer = self._consumer_of()
        consumer.assign([TopicPartition(self._topic, right, start.get(right, 0)) for right in wanted])
        try:
            while wanted:
                if self._deadline.passed():
                    raise RecoveryError(
                        f"the foreign-key join of app {self._config.name!r} could not read {self._topic} again up "
                        f"to {end} in time; check that the brokers answer, or give the run more time"
                    )
                for message in consumer.consume(READ_BATCH, timeout=0.2):
                    self._take_read(message, wanted, latest)
        finally:
            consumer.unassign()
        log.info("Read %d updated keys of table %r again for the foreign-key join", len(latest), self._table.name)
        return latest

    def _take_read(self, message: Message, wanted: dict[int, int], latest: dict[bytes, Message]) -> None:
        failure = message.error()
        right = message.partition() or 0
        if failure is not None:
            if failure.code() != KafkaError._PARTITION_EOF:
                raise KafkaException(failure)
            wanted.pop(right, None)  # the partition holds nothing more (compaction removed the rest)
            return
        offset, until = message.offset() or 0, wanted.get(right)
        if until is None or offset >= until:
            wanted.pop(right, None)  # past the copy's position: the copy applies it later
            return
        if offset + 1 >= until:
            wanted.pop(right)
        key = message.key()
        if key is not None and record_fault(self._table, key, message.value()) is None:
            latest.pop(key, None)
            latest[key] = message

    def _consumer_of(self) -> Consumer:
        if self._consumer is None:
            self._consumer = self._kafka.consumer({"group.id": self._config.restore_group, **SIDE_READER_CONFIG})
        return self._consumer
