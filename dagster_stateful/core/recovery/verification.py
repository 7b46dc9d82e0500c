"""Verifying a store partition: a digest of its content, and the digest a changelog replay gives.

Owns `partition_digest` (SHA-256 over every key and value in key order, with the key count) and
`replay_digest`, which rebuilds the partition from the changelog alone in a scratch directory, so
a bulk-restored partition can be compared with what the ordinary recovery would have produced.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import RESTORE_CONSUMER_CONFIG, KafkaClients
from dagster_stateful.core.monitoring.listeners import Listeners
from dagster_stateful.core.recovery.restorer import Restorer
from dagster_stateful.core.state.commit_metadata import decode_commit_metadata
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.partition import StorePartition


@dataclass(frozen=True)
class Digest:
    sha256: str
    keys: int


def partition_digest(store: StorePartition) -> Digest:
    """Digest of an open store partition's content."""
    digest = hashlib.sha256()
    keys = 0
    for key, value in store.items():
        digest.update(len(key).to_bytes(4, "big") + key + len(value).to_bytes(4, "big") + value)
        keys += 1
    return Digest(digest.hexdigest(), keys)


def replay_digest(config: AppConfig, kafka: KafkaClients, store: str, partition: int) -> Digest:
    """Digest of the partition rebuilt from the changelog alone (up to the current end)."""
    committed, metadata = kafka.committed(config.consumer_group, config.task_topic, [partition])[partition]
    recorded = decode_commit_metadata(metadata, committed, f"{config.task_topic}[{partition}]")
    consumer = kafka.consumer({"group.id": config.verify_group, **RESTORE_CONSUMER_CONFIG})
    with tempfile.TemporaryDirectory(prefix="verify-") as scratch:
        replica = StateDirectory(Path(scratch), config).partition(store, partition)
        replica.open()
        try:
            restorer = Restorer(kafka, consumer, Listeners(), config.restore_batch_size, group=config.verify_group)
            restorer.restore(replica, committed, recorded.changelog_ends.get(store), recorded.bare_uncommitted)
            return partition_digest(replica)
        finally:
            replica.close()
            consumer.close()
