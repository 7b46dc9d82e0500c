"""How far a worker got: messages left per partition, and offsets moved past transaction markers.

Owns `held_lag` (each partition this worker processes, read against the partition's end), `group_lag`
(every partition of the source, by the group's committed offsets: what a bounded run reports, and
what a worker that holds no partition waits on) and `pass_markers` (a transactional producer's
commit markers sit on offsets no message has: once every message before them is processed, the
committed offset moves past them, or the group would never look caught up).
"""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import Consumer, TopicPartition

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.monitoring.lag import partition_lag
from dagster_stateful.core.state.transaction import PartitionTransaction


def pass_markers(consumer: Consumer, source: str, transactions: Mapping[int, PartitionTransaction]) -> None:
    """Move each partition's next offset to the consumer's position when that is further.

    Only between batches, when every message consume() returned has been processed: the position
    then counts nothing unprocessed, only markers no message sits on. A run that stops at
    max_messages in the middle of a batch must not call it.
    """
    if not transactions:
        return
    for topic_partition in consumer.position([TopicPartition(source, p) for p in transactions]):
        txn = transactions.get(topic_partition.partition)
        if txn is not None and txn.next_offset is not None and topic_partition.offset > txn.next_offset:
            txn.next_offset = topic_partition.offset


def held_lag(
    kafka: KafkaClients, consumer: Consumer, source: str, transactions: Mapping[int, PartitionTransaction]
) -> dict[int, int]:
    """Messages left per held partition. The ends are read with one admin request (asking the
    fetching consumer would queue behind its long-polling fetches); the consumer's position counts
    too, since it moves past transaction markers no message sits on (call between batches)."""
    if not transactions:
        return {}
    marks = kafka.watermarks(source, transactions)
    positions = {tp.partition: tp.offset for tp in consumer.position([TopicPartition(source, p) for p in transactions])}
    lag = {}
    for partition, (low, high) in marks.items():
        done = max(_or(transactions[partition].next_offset, low), positions.get(partition, -1))
        lag[partition] = max(0, high - done)
    return lag


def group_lag(
    kafka: KafkaClients, consumer: Consumer, config: AppConfig, transactions: Mapping[int, PartitionTransaction]
) -> dict[int, int]:
    """Messages left per partition of the whole source topic, by the group's committed offsets (this
    worker's own progress where it is further)."""
    partitions = range(kafka.partition_count(config.source) or 0)
    committed = kafka.committed_offsets(config.consumer_group, config.source, partitions)
    marks = kafka.watermarks(config.source, partitions)
    held = held_lag(kafka, consumer, config.source, transactions)
    lag = {p: partition_lag(committed.get(p), low, high) for p, (low, high) in marks.items()}
    return {p: min(lag[p], held.get(p, lag[p])) for p in lag}


def _or(offset: int | None, default: int) -> int:
    return default if offset is None else offset
