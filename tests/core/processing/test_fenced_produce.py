"""A fenced transactional producer refuses even to enqueue a record: that is a fenced worker too.

A zombie's first sign of being fenced may come from `produce` (librdkafka's _FATAL) rather than
from a transaction call; the worker must then stop with `ProducerFencedError`, saying it was fenced,
not with a generic Kafka failure.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from dagster_stateful.core.processing.commit.transactions import KafkaTransactions
from dagster_stateful.errors import ProducerFencedError


def transactions() -> KafkaTransactions:
    producer = Producer({"bootstrap.servers": "127.0.0.1:1", "transactional.id": "fenced-test"})
    return KafkaTransactions(producer, consumer=None, timeout_seconds=1.0)  # type: ignore[arg-type]


def test_a_fatal_produce_error_is_a_fenced_producer():
    fatal = KafkaException(KafkaError(KafkaError._FATAL, "Unable to produce message: Local: Fatal error"))

    with pytest.raises(ProducerFencedError, match="zombie and was fenced"):
        transactions().raise_if_fenced("producing a record to counts-changelog", fatal)


def test_other_produce_errors_are_left_to_the_caller():
    transactions().raise_if_fenced("producing", KafkaException(KafkaError(KafkaError._QUEUE_FULL)))
