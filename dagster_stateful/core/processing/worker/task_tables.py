"""The partitioned tables of one partition of the stream that joins them, committed with that partition.

Owns `TaskTables`, a participant of the partition's commit (`participant.Participant`): the
positions of its tables (`commit_metadata.table_entry`) and, with a grace, the join's stream time
(`JOIN_STREAM_TIME`) go into the commit's metadata; once the commit went through the tables' changes
are written locally, and a roll-back drops them and fetches the tables again from what they applied.
It also holds the records waiting for the grace (`hold`: released once it passed), and those
released, in offset order.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from confluent_kafka import Message

from dagster_stateful.core.processing.worker.table_partition import TablePartition, position_of
from dagster_stateful.core.state.commit_metadata import JOIN_STREAM_TIME, table_entry

MAX_WAITING = 200_000
"""Records that may wait for a join's grace per partition (about 100 MiB of typical records)."""


class TablesOwner(Protocol):
    """What keeps the tables (`tables.PartitionedTables`)."""

    @property
    def grace_ms(self) -> int: ...

    def reposition(self, partitions: list[TablePartition]) -> None: ...


class TaskTables:
    """The tables of one partition of the stream that joins them, as a participant of its commit
    (`participant.Participant`): their positions and the join's stream time commit with it."""

    def __init__(self, owner: TablesOwner, partition: int, held: list[TablePartition], stream_time: int) -> None:
        self._owner = owner
        self.partition = partition
        self.held = held
        self.stream_time = self.committed_stream_time = stream_time
        self.waiting: deque[Message] = deque()
        """Records waiting for the grace to pass, in offset order."""
        self.released: list[Message] = []
        """Records whose grace passed, not processed yet, in offset order."""
        self.by_name: dict[str, TablePartition] = {}
        """The partitions held, by table name (filled as they open)."""

    def hold(self, message: Message, grace_ms: int) -> bool:
        """Hold `message` until the partition's stream time passes its timestamp plus `grace_ms`; the
        records whose grace has passed move to `released`. Memory is bounded: past `MAX_WAITING`
        records waiting, the oldest is released now (returns True when it was)."""
        self.stream_time = max(self.stream_time, message.timestamp()[1])
        waiting = self.waiting
        waiting.append(message)
        reached = self.stream_time - grace_ms
        while waiting and waiting[0].timestamp()[1] <= reached:
            self.released.append(waiting.popleft())
        if len(waiting) <= MAX_WAITING:
            return False
        self.released.append(waiting.popleft())
        return True

    def first_waiting(self) -> int | None:
        """The offset of the first record waiting for its grace, or released and not processed (None: none)."""
        first = self.released or self.waiting
        return position_of(first[0]) if first else None

    @property
    def needs_commit(self) -> bool:
        """Never on its own: tables are applied only before the task's records, which move its offset."""
        return False

    def positions_to_commit(self) -> dict[str, int]:
        positions = {table_entry(held.table.name): held.applied for held in self.held}
        if self._owner.grace_ms:
            positions[JOIN_STREAM_TIME] = max(self.stream_time, 0)
        return positions

    def committed_positions(self) -> dict[str, int]:
        positions = {table_entry(held.table.name): held.committed for held in self.held}
        if self._owner.grace_ms:
            positions[JOIN_STREAM_TIME] = max(self.committed_stream_time, 0)
        return positions

    def committed(self) -> None:
        for held in self.held:
            held.commit()
        self.committed_stream_time = self.stream_time

    def roll_back(self) -> None:
        self.waiting.clear()
        self.released.clear()
        self.stream_time = self.committed_stream_time
        for held in self.held:
            held.roll_back()
        self._owner.reposition(self.held)
