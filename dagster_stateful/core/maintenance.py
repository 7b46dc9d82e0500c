"""Describing an app's store partitions without running a worker.

Owns `describe_partitions`: what an operator or a sensor wants to know about each store
partition: local checkpoint, changelog and source offsets, how far the local state is behind its
changelog, keys and bytes on disk. Offsets come through the Kafka adapter, local progress from
`.checkpoint` files (RocksDB is opened only to estimate keys, and not when a worker holds it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from dagster_stateful.core.checkpoint import read_checkpoint
from dagster_stateful.core.store import StorePartition, partition_path
from dagster_stateful.errors import StateLockedError

if TYPE_CHECKING:
    from dagster_stateful.core.app import App


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
    """RocksDB's estimate; None when a running worker holds the partition."""
    bytes_on_disk: int

    def to_dict(self) -> dict:
        return asdict(self)


def describe_partitions(app: App, partitions: Iterable[int] | None = None,
                        stores: Iterable[str] | None = None) -> list[PartitionDescription]:
    source_partitions = app.kafka.partition_count(app.source) or 0
    chosen = sorted(partitions) if partitions is not None else list(range(source_partitions))
    committed = app.kafka.committed_offsets(app.consumer_group, app.source, chosen) if chosen else {}
    source_marks = app.kafka.watermarks(app.source, chosen)
    descriptions = []
    for name in stores or app.stores:
        topic = app.changelog_topic(name)
        changelog_marks = (app.kafka.watermarks(topic, chosen) if app.kafka.partition_count(topic)
                           else {p: (0, 0) for p in chosen})
        for partition in chosen:
            path = partition_path(app.state_dir, app.name, name, partition)
            checkpoint = read_checkpoint(path)
            local = checkpoint.changelog_offset if checkpoint else None
            low, high = changelog_marks[partition]
            source_high = source_marks[partition][1]
            descriptions.append(PartitionDescription(
                store=name, partition=partition, changelog_topic=topic, changelog_low=low, changelog_high=high,
                local_changelog_offset=local, changelog_lag=max(0, high - (local if local is not None else low)),
                committed_source_offset=committed.get(partition), source_high=source_high,
                source_lag=max(0, source_high - (committed.get(partition) or source_marks[partition][0])),
                keys=_estimated_keys(app, name, partition), bytes_on_disk=_bytes_on_disk(path)))
    return descriptions


def _estimated_keys(app: App, store: str, partition: int) -> int | None:
    path = partition_path(app.state_dir, app.name, store, partition)
    if not path.exists():
        return 0
    part = StorePartition(app.state_dir, app.name, store, partition, app.changelog_topic(store), app.source)
    try:
        part.open()
    except StateLockedError:
        return None
    try:
        return part.db.estimated_keys()
    finally:
        part.close()


def _bytes_on_disk(path) -> int:
    if not path.exists():
        return 0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
