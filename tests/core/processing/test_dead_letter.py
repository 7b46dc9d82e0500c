"""Dead-lettering waits out a full producer queue instead of failing (real broker).

A burst of bad messages can fill the producer's local queue faster than the broker acknowledges;
the dead-letter produce must then serve delivery reports and retry, as the output produce does,
not raise `BufferError` out of the worker.
"""

from __future__ import annotations

from confluent_kafka import Consumer, Producer
from support.kafka_helpers import create_topic, produce, read_messages

from dagster_stateful.core.config import ErrorPolicy
from dagster_stateful.core.processing.commit.committer import Committer
from dagster_stateful.core.processing.commit.delivery import DeliveryTracker
from dagster_stateful.core.processing.paths.bad_input import ERROR_HEADER_PREFIX, BadInputHandler

BAD_MESSAGES = 40


def test_dead_lettering_many_messages_through_a_tiny_producer_queue(kafka_bootstrap, unique_name):
    source, dead_letters = unique_name("orders"), unique_name("dead-letters")
    create_topic(kafka_bootstrap, source)
    create_topic(kafka_bootstrap, dead_letters)
    produce(kafka_bootstrap, source, [(f"c{i}".encode(), f"not json {i}".encode()) for i in range(BAD_MESSAGES)])
    bad = read_messages(kafka_bootstrap, source)
    # One message fits in the queue, and it lingers there: the second produce finds the queue full.
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "queue.buffering.max.messages": 1, "linger.ms": 50})
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": unique_name("group")})
    committer = Committer(consumer, producer, DeliveryTracker(), source, None)
    handler = BadInputHandler(ErrorPolicy.DEAD_LETTER, committer.produce, dead_letters)

    for message in bad:
        handler.handle(message, "deserializing the key or value", ValueError("invalid JSON"))

    assert producer.flush(30) == 0
    consumer.close()
    assert handler.dead_lettered == BAD_MESSAGES
    letters = read_messages(kafka_bootstrap, dead_letters)
    assert [(letter.key(), letter.value()) for letter in letters] == [(m.key(), m.value()) for m in bad]
    offsets = [dict(letter.headers())[f"{ERROR_HEADER_PREFIX}source-offset"] for letter in letters]
    assert offsets == [str(m.offset()).encode() for m in bad]
