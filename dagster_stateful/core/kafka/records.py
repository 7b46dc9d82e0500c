"""Records as Kafka hands them over: where a consumed or delivered record sits, and its headers.

Owns `position` (topic, partition and offset of a record, which librdkafka always sets on consumed
and delivered records although its types allow None) and the `Headers` type the engine writes.
"""

from __future__ import annotations

from confluent_kafka import Message

from dagster_stateful.errors import KafkaOperationError

Headers = list[tuple[str, str | bytes | None]]


def position(message: Message) -> tuple[str, int, int]:
    """(topic, partition, offset) of a consumed or delivered record."""
    topic, partition, offset = message.topic(), message.partition(), message.offset()
    if topic is None or partition is None or offset is None:
        raise KafkaOperationError(
            f"Kafka handed over a record without a position: topic {topic}, partition {partition}, offset {offset}"
        )
    return topic, partition, offset
