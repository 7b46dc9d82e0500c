"""Describing an app's store partitions without running a worker.

Owns `describe_partitions`: what an operator or a sensor wants to know about each store
partition: local checkpoint, changelog and source offsets, how far the local state is behind its
changelog, keys (counted in small partitions, RocksDB's estimate in large ones) and bytes on disk.
Offsets come through the Kafka adapter, local progress from `.checkpoint` files (RocksDB is opened
only to count keys, and not when a worker holds it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.monitoring.lag import partition_lag
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.keys import is_reserved
from dagster_stateful.errors import StateLockedError

EXACT_KEYS_UP_TO = 200_000
"""Partitions estimated to hold at most this many keys have them counted (a fraction of a second)."""


@dataclass
class PartitionDescription:
    store: str
    partition: int
    changelog_topic: str
    changelog_low: int
    changelog_high: int
    local_changelog_offset: int | None
    """From the `.checkpoint` file; None when there is no local state."""
    changelog_lag: int
    """Changelog records the local state has not seen (the whole changelog without local state)."""
    committed_source_offset: int | None
    source_high: int
    source_lag: int
    keys: int | None
    """Keys in the partition: counted when `keys_exact`, else RocksDB's estimate (which counts
    overwritten and deleted keys until compaction drops them); None when a running worker holds it."""
    bytes_on_disk: int
    keys_exact: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def describe_partitions(
    config: AppConfig,
    kafka: KafkaClients,
    state: StateDirectory,
    partitions: Iterable[int] | None = None,
    stores: Iterable[str] | None = None,
) -> list[PartitionDescription]:
    source_partitions = kafka.partition_count(config.task_topic) or 0
    chosen = sorted(partitions) if partitions is not None else list(range(source_partitions))
    committed = kafka.committed_offsets(config.consumer_group, config.task_topic, chosen) if chosen else {}
    source_marks = kafka.watermarks(config.task_topic, chosen)
    descriptions = []
    for name in stores or config.stores:
        topic = config.changelog_topic(name)
        changelog_marks = (
            kafka.watermarks(topic, chosen) if kafka.partition_count(topic) else dict.fromkeys(chosen, (0, 0))
        )
        for partition in chosen:
            checkpoint = state.read_checkpoint(name, partition)
            local = checkpoint.changelog_offset if checkpoint else None
            low, high = changelog_marks[partition]
            source_low, source_high = source_marks[partition]
            committed_offset = committed.get(partition)
            descriptions.append(
                PartitionDescription(
                    store=name,
                    partition=partition,
                    changelog_topic=topic,
                    changelog_low=low,
                    changelog_high=high,
                    local_changelog_offset=local,
                    changelog_lag=max(0, high - (local if local is not None else low)),
                    committed_source_offset=committed_offset,
                    source_high=source_high,
                    source_lag=partition_lag(committed_offset, source_low, source_high),
                    **_keys(state, name, partition),
                    bytes_on_disk=state.bytes_on_disk(name, partition),
                )
            )
    return descriptions


def _keys(state: StateDirectory, store: str, partition: int) -> dict[str, Any]:
    """`keys` and `keys_exact` of a partition: counted up to `EXACT_KEYS_UP_TO`, else estimated."""
    if not state.partition_path(store, partition).exists():
        return {"keys": 0, "keys_exact": True}
    part = state.partition(store, partition)
    try:
        part.open(lock_timeout=0)
    except StateLockedError:
        return {"keys": None, "keys_exact": False}
    try:
        estimate = part.db.estimated_keys()
        if estimate > EXACT_KEYS_UP_TO:
            return {"keys": estimate, "keys_exact": False}
        return {"keys": sum(1 for key, _ in part.items() if not is_reserved(key)), "keys_exact": True}
    finally:
        part.close()
