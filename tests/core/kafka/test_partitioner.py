"""Which partition a key's messages reach: Kafka's murmur2 (its own test vectors) and librdkafka's
CRC-32, checked against where confluent-kafka's producers put keys on a real topic."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer
from support.kafka_helpers import create_topic, read_messages

from dagster_stateful.core.kafka.partitioner import murmur2, partition_of

KEYS = [f"customer-{i}".encode() for i in range(200)] + [b"", b"a", b"ab", b"abc", "ключ".encode(), bytes(range(256))]


def test_murmur2_gives_kafkas_own_test_vectors():
    signed = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536, b"": 275646681}
    for data, expected in signed.items():
        assert murmur2(data) == expected & 0xFFFFFFFF, data


@pytest.mark.parametrize(("librdkafka", "ours"), [("murmur2_random", "murmur2"), ("consistent_random", "consistent")])
def test_each_key_lands_where_confluent_kafkas_producer_puts_it(kafka_bootstrap, unique_name, librdkafka, ours):
    topic = unique_name("keys")
    create_topic(kafka_bootstrap, topic, partitions=7)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": librdkafka})
    for key in KEYS:
        producer.produce(topic, key=key, value=b"x")
    assert producer.flush(30) == 0

    placed = {message.key(): message.partition() for message in read_messages(kafka_bootstrap, topic)}

    assert len(placed) == len(KEYS)
    if ours == "consistent":  # librdkafka places an empty key at random: no partition is its own
        placed.pop(b"")
        with pytest.raises(ValueError, match="empty key"):
            partition_of(b"", 7, ours)
    wrong = {
        key: (where, partition_of(key, 7, ours)) for key, where in placed.items() if partition_of(key, 7, ours) != where
    }
    assert not wrong, f"(where the producer put it, where {ours} says): {wrong}"
