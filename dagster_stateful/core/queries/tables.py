"""Describing an app's partitioned tables without running a worker.

Owns `describe_tables`: per table and partition, where the group's last commit has the table
applied up to (the position a worker records in the commit metadata of the partition of the
stream that joins the table, `commit_metadata.table_entry`), where the table's topic starts and
ends for a `read_committed` reader, the table records not applied by that commit yet, and whether
this machine holds a copy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.state.commit_metadata import decode_commit_metadata, table_entry
from dagster_stateful.core.state.directory import TABLES_DIR, StateDirectory


@dataclass
class TablePartitionDescription:
    table: str
    topic: str
    partition: int
    committed_position: int | None
    """The offset of the next table record the group's last commit had not applied (None: no
    commit recorded one yet)."""
    topic_low: int
    topic_end: int
    """Where a `read_committed` reader of the table's topic stops (its last stable offset)."""
    records_not_applied: int
    """Table records at or past the committed position (every record when there is none)."""
    position_valid: bool
    """False when the committed position lies past the topic's end (the topic was recreated):
    workers then read the table again from its beginning."""
    local_copy: bool
    """Whether this machine holds a copy of the partition."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def describe_tables(
    config: AppConfig, kafka: KafkaClients, state: StateDirectory, partitions: Iterable[int] | None = None
) -> list[TablePartitionDescription]:
    descriptions = []
    recorded: dict[str, dict[int, dict[str, int]]] = {}
    for name, topic in config.tables.items():
        stream_topic = config.table_stream_topic(name)
        count = kafka.partition_count(stream_topic) or 0
        chosen = sorted(partitions) if partitions is not None else list(range(count))
        if stream_topic not in recorded:
            recorded[stream_topic] = _recorded(config, kafka, stream_topic, chosen)
        positions = recorded[stream_topic]
        marks = kafka.watermarks(topic, chosen, committed=True) if kafka.partition_count(topic) else {}
        for partition in chosen:
            low, end = marks.get(partition, (0, 0))
            position = positions.get(partition, {}).get(table_entry(name))
            descriptions.append(
                TablePartitionDescription(
                    table=name,
                    topic=topic,
                    partition=partition,
                    committed_position=position,
                    topic_low=low,
                    topic_end=end,
                    records_not_applied=max(0, end - max(low, position or 0)),
                    position_valid=position is None or position <= end,
                    local_copy=(state.app_dir / TABLES_DIR / name / str(partition)).is_dir(),
                )
            )
    return descriptions


def _recorded(config: AppConfig, kafka: KafkaClients, topic: str, partitions: list[int]) -> dict[int, dict[str, int]]:
    """The metadata entries of the group's last commit of each of `topic`'s `partitions`."""
    committed = kafka.committed(config.consumer_group, topic, partitions) if partitions else {}
    return {
        partition: dict(decode_commit_metadata(metadata, offset, f"{topic}[{partition}]").stream_times)
        for partition, (offset, metadata) in committed.items()
    }
