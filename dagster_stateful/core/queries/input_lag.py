"""The work waiting on every input of an app, read from outside a run.

Owns `describe_inputs` and what it returns, `InputsLag`, one entry per kind of input. **Streams**
(the source and, for a re-keying app, its repartition topic): per partition, the group's committed
offset, the watermarks and the messages left (`monitoring.lag.partition_lag`), work a worker run
does; records the re-keying sent to the repartition topic count as soon as they are written.
**Partitioned tables**: per table and partition, the table records the group's last commit had not
applied (`tables.describe_tables`); a worker applies them as the task's records come, so they make
no run necessary on their own, and a table updated after the task's newest record may show some
between runs. **Global tables**: no position is committed for them, so what is known is their size,
from each partition's low watermark to its end: the most a worker's start reads (one without a
local copy reads all of it, one with a copy only what arrived since it last ran).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.monitoring.lag import partition_lag
from dagster_stateful.core.queries.tables import TablePartitionDescription, describe_tables
from dagster_stateful.core.state.directory import StateDirectory


@dataclass(frozen=True)
class StreamPartitionLag:
    """One partition of a stream input: where the group committed, and the partition's watermarks."""

    topic: str
    partition: int
    committed: int | None
    """The group's committed offset (the next message to process); None when it never committed one."""
    low: int
    high: int

    @property
    def lag(self) -> int:
        return partition_lag(self.committed, self.low, self.high)


@dataclass(frozen=True)
class GlobalTableSize:
    """A global table's topic: each partition's (low watermark, end)."""

    table: str
    topic: str
    offsets: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def ends(self) -> dict[int, int]:
        return {partition: end for partition, (_, end) in self.offsets.items()}

    @property
    def records_at_most(self) -> int:
        """Offsets from each partition's low watermark to its end: the most a worker's start reads
        (compaction gaps and transaction markers make the records fewer)."""
        return sum(max(0, end - low) for low, end in self.offsets.values())


@dataclass(frozen=True)
class InputsLag:
    streams: dict[str, dict[int, StreamPartitionLag]]
    """Stream input topic (the source first) -> partition -> its lag."""
    tables: list[TablePartitionDescription]
    """Per partitioned table and partition: its `records_not_applied` by the group's last commit."""
    global_tables: list[GlobalTableSize]

    @property
    def stream_lag(self) -> int:
        """Messages left on every stream input together: the work a worker run does."""
        return sum(p.lag for partitions in self.streams.values() for p in partitions.values())

    def table_lag(self) -> dict[str, int]:
        """Partitioned table name -> its records not applied, over every partition."""
        totals: dict[str, int] = {}
        for description in self.tables:
            totals[description.table] = totals.get(description.table, 0) + description.records_not_applied
        return totals


def describe_inputs(config: AppConfig, kafka: KafkaClients, state: StateDirectory) -> InputsLag:
    """The lag of each stream input, the partitioned tables' records not applied, and the global tables' sizes."""
    return InputsLag(
        streams={topic: stream_lag(config, kafka, topic) for topic in config.input_topics},
        tables=describe_tables(config, kafka, state),
        global_tables=[global_table_size(kafka, name, topic) for name, topic in config.global_tables.items()],
    )


def stream_lag(config: AppConfig, kafka: KafkaClients, topic: str) -> dict[int, StreamPartitionLag]:
    """Every partition of input `topic`, against the group's committed offsets (none for a missing topic)."""
    partitions = range(kafka.partition_count(topic) or 0)
    committed = kafka.committed_offsets(config.consumer_group, topic, partitions)
    marks = kafka.watermarks(topic, partitions)
    return {p: StreamPartitionLag(topic, p, committed.get(p), low, high) for p, (low, high) in marks.items()}


def global_table_size(kafka: KafkaClients, table: str, topic: str) -> GlobalTableSize:
    """The watermarks of global table `table`'s topic (none when the topic does not exist)."""
    partitions = range(kafka.partition_count(topic) or 0)
    return GlobalTableSize(table, topic, kafka.watermarks(topic, partitions))
