"""What the worker's producer reports of its deliveries, and how long it keeps trying.

Owns `DeliveryTracker`, the producer's delivery callback (failures, and the last acknowledged
offset per topic partition when the producer reports every delivery), and the delivery timeout a
producer configuration gives (`delivery_timeout_seconds`).
"""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import KafkaError, Message

from dagster_stateful.core.kafka.records import position
from dagster_stateful.core.kafka.security.authorization import is_authorization_failure

DEFAULT_DELIVERY_TIMEOUT_MS = 120_000
"""The worker producer's `delivery.timeout.ms` unless `producer_config` sets it (Kafka Streams'
default): how long a record may wait for the brokers, through an outage, before it fails."""


def delivery_timeout_seconds(producer_config: Mapping[str, object]) -> float:
    """The delivery timeout a producer with this configuration applies (librdkafka's alias
    `message.timeout.ms` included), in seconds."""
    for name in ("delivery.timeout.ms", "message.timeout.ms"):
        if name in producer_config:
            return float(str(producer_config[name])) / 1000
    return DEFAULT_DELIVERY_TIMEOUT_MS / 1000


class DeliveryTracker:
    """The producer's delivery callback: remembers failures (every one, for the run; those refused
    for want of an ACL also by topic) and the last offset per topic partition."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.refused: dict[str, KafkaError] = {}
        """Topic -> Kafka's authorization error for a record refused there."""
        self.last_offsets: dict[tuple[str, int], int] = {}

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.errors.append(f"{message.topic()}[{message.partition()}]: {error.str()}")
            if is_authorization_failure(error):
                self.refused.setdefault(str(message.topic()), error)
            return
        topic, partition, offset = position(message)
        if offset > self.last_offsets.get((topic, partition), -1):
            self.last_offsets[(topic, partition)] = offset

    def next_offset(self, topic: str, partition: int) -> int | None:
        last = self.last_offsets.get((topic, partition))
        return None if last is None else last + 1
