"""The Kafka adapter: the only module of the core that talks to confluent-kafka directly.

Owns client construction from one set of connection settings (bootstrap servers, security; the
caller passes secrets in, this module never logs settings) and the administrative reads and
writes the engine needs: topic partition counts and configs, topic creation, low/high watermarks
and a consumer group's committed offsets.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    NewTopic,
    OffsetSpec,
)

log = logging.getLogger(__name__)

ADMIN_TIMEOUT = 30.0
NO_OFFSET = -1001  # librdkafka's OFFSET_INVALID: the group has no committed offset


class KafkaClients:
    """Makes producers, consumers and admin calls from one set of connection settings."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        if "bootstrap.servers" not in settings:
            raise ValueError("Kafka settings need 'bootstrap.servers'")
        self.settings = dict(settings)
        self._admin: AdminClient | None = None

    @property
    def bootstrap_servers(self) -> str:
        return str(self.settings["bootstrap.servers"])

    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self.settings)
        return self._admin

    def producer(self, config: Mapping[str, Any] | None = None) -> Producer:
        return Producer({**self.settings, **(config or {})})

    def consumer(self, config: Mapping[str, Any]) -> Consumer:
        return Consumer({**self.settings, **config})

    def partition_count(self, topic: str) -> int | None:
        """The topic's partition count, or None when it does not exist."""
        metadata = self.admin().list_topics(topic, timeout=ADMIN_TIMEOUT).topics.get(topic)
        if metadata is None or metadata.error is not None and metadata.error.code() in (
                KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
            return None
        if metadata.error is not None:
            raise KafkaException(metadata.error)
        return len(metadata.partitions)

    def topic_config(self, topic: str) -> dict[str, str]:
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        entries = self.admin().describe_configs([resource])[resource].result(timeout=ADMIN_TIMEOUT)
        return {name: entry.value for name, entry in entries.items() if entry.value is not None}

    def create_topic(self, name: str, partitions: int, replication_factor: int, config: Mapping[str, str]) -> None:
        topic = NewTopic(name, num_partitions=partitions, replication_factor=replication_factor, config=dict(config))
        future = self.admin().create_topics([topic], operation_timeout=ADMIN_TIMEOUT)[name]
        try:
            future.result(timeout=ADMIN_TIMEOUT)
        except KafkaException as error:
            if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
        log.info("Created topic %s (%d partitions, replication %d, %s)", name, partitions, replication_factor,
                 dict(config))

    def watermarks(self, topic: str, partitions: Iterable[int]) -> dict[int, tuple[int, int]]:
        """(low, high) offsets per partition."""
        partitions = list(partitions)
        if not partitions:
            return {}
        low = self._list_offsets(topic, partitions, OffsetSpec.earliest())
        high = self._list_offsets(topic, partitions, OffsetSpec.latest())
        return {p: (low[p], high[p]) for p in partitions}

    def _list_offsets(self, topic: str, partitions: list[int], spec: OffsetSpec) -> dict[int, int]:
        futures = self.admin().list_offsets({TopicPartition(topic, p): spec for p in partitions},
                                            request_timeout=ADMIN_TIMEOUT)
        return {tp.partition: future.result(timeout=ADMIN_TIMEOUT).offset for tp, future in futures.items()}

    def committed_offsets(self, group: str, topic: str, partitions: Iterable[int]) -> dict[int, int | None]:
        """The group's committed offset per partition (None where it never committed)."""
        request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in partitions])
        result = self.admin().list_consumer_group_offsets([request])[group].result(timeout=ADMIN_TIMEOUT)
        return {tp.partition: (None if tp.offset < 0 else tp.offset) for tp in result.topic_partitions}

