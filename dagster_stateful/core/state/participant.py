"""Work on a partition kept outside its stores that commits and rolls back with the partition.

Owns the `Participant` protocol: what a partition's commit asks of such work (the partition's
partitioned tables, `worker.task_tables.TaskTables`, or a joined stream's partition,
`worker.joined_streams.StreamSide`): the entries it records in the commit's
metadata, what the last commit recorded, and what to do once the commit went through or was
dropped. A `transaction.PartitionTransaction` holds one for its partition; a re-keying app's source
partition (`rekeying.Rekeying`), which has no transaction, holds its own.
"""

from __future__ import annotations

from typing import Protocol


class Participant(Protocol):
    """Work on a partition, kept outside its stores, that commits and rolls back with it."""

    @property
    def needs_commit(self) -> bool:
        """Whether it did work since the last commit that the partition's offset does not show."""
        ...

    def positions_to_commit(self) -> dict[str, int]:
        """What the commit's metadata records of it, beside the stores' stream times."""
        ...

    def committed_positions(self) -> dict[str, int]:
        """What the last commit recorded of it."""
        ...

    def committed(self) -> None:
        """The commit went through (Kafka has it): make its work durable locally."""
        ...

    def roll_back(self) -> None:
        """Drop the work since the last commit."""
        ...


class Partners(Protocol):
    """What keeps a participant beside each task partition a worker holds (its partitioned tables,
    or a joined stream's partitions)."""

    def open(self, partition: int, recorded: dict[str, int]) -> Participant:
        """Take the work beside task `partition`, as its last commit's metadata entries recorded it."""
        ...

    def close(self, partition: int) -> None: ...
