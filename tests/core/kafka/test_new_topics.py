"""Offsets of a topic just created answer at once: `create_topic` returns only once every new
partition answers, and `watermarks` waits out partitions whose leader is not serving yet."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from dagster_stateful.core.kafka.clients import KafkaClients

PARTITIONS = 24
ROUNDS = 4
EMPTY = dict.fromkeys(range(PARTITIONS), (0, 0))


@pytest.fixture
def wide_topics(kafka_bootstrap) -> Iterator[list[str]]:
    """Names of the test's wide topics, deleted afterwards to keep the shared broker small."""
    made: list[str] = []
    yield made
    if made:
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        for future in admin.delete_topics(made, operation_timeout=30).values():
            future.result(timeout=60)


def test_watermarks_of_a_topic_created_elsewhere_a_moment_ago(kafka_bootstrap, unique_name, wide_topics):
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for _ in range(ROUNDS):
        clients = KafkaClients({"bootstrap.servers": kafka_bootstrap})
        topic = unique_name("wide")
        assert clients.partition_count(topic) is None  # as provisioning does: look, then create
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(timeout=30)
        wide_topics.append(topic)

        for _ in range(3):
            assert clients.watermarks(topic, range(PARTITIONS)) == EMPTY


def test_create_topic_returns_once_every_partition_answers(kafka_bootstrap, unique_name, wide_topics):
    clients = KafkaClients({"bootstrap.servers": kafka_bootstrap})
    for _ in range(ROUNDS):
        topic = unique_name("wide")
        assert clients.partition_count(topic) is None
        clients.create_topic(topic, PARTITIONS, -1, {})
        wide_topics.append(topic)

        # One plain ListOffsets, no retry: every partition serves already.
        futures = clients.admin().list_offsets(
            {TopicPartition(topic, p): OffsetSpec.latest() for p in range(PARTITIONS)}, request_timeout=10
        )
        assert {tp.partition: future.result(timeout=15).offset for tp, future in futures.items()} == dict.fromkeys(
            range(PARTITIONS), 0
        )
        for _ in range(3):
            assert clients.watermarks(topic, range(PARTITIONS)) == EMPTY
            assert KafkaClients({"bootstrap.servers": kafka_bootstrap}).watermarks(topic, range(PARTITIONS)) == EMPTY
