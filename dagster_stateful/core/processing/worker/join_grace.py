"""The grace of a join with a versioned table (KIP-923): records wait until their stream time passed.

Owns `GracefulBatches`, the path of an app whose records join a versioned table with a grace: each
consumed record goes to `tables.PartitionedTables.hold`, which keeps it, per partition and in
offset order, until the partition's stream time reaches its timestamp plus the grace; the records
released go down the task's path (per message, through `BatchProcessor`).
"""

from __future__ import annotations

from confluent_kafka import Message

from dagster_stateful.core.processing.paths.rekeying import BatchPath
from dagster_stateful.core.processing.worker.tables import PartitionedTables


class GracefulBatches:
    """The batches of an app whose records join a versioned table with a grace: each record waits
    in `PartitionedTables.hold` until its grace passed, then goes down the task's path."""

    def __init__(self, tables: PartitionedTables, state_path: BatchPath) -> None:
        self._tables = tables
        self._state_path = state_path

    @property
    def messages_in_columns(self) -> int:
        return self._state_path.messages_in_columns

    def process(self, messages: list[Message], start: int, budget: int) -> tuple[int, int]:
        """As `BatchProcessor.process`: the records released by this batch are processed, the others
        wait; Kafka's errors go down the path at once (which raises them)."""
        index, end, done = start, len(messages), 0
        while done < budget:
            task = self._tables.released()
            if task is not None:
                taken, ran = self._state_path.process(task.released, 0, budget - done)
                del task.released[:taken]
                done += ran
                if taken:
                    continue
            if index >= end:
                break
            message = messages[index]
            index += 1
            if message.error() is not None or not self._tables.hold(message):
                self._state_path.process([message], 0, 1)  # Kafka's error (raised), or a partition not held
        return index, done
