"""Kafka's errors leave the engine as `KafkaOperationError`s that keep Kafka's error code."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException
from kafka_helpers import create_topic

from dagster_stateful.core import KafkaOperationError, StatefulError
from dagster_stateful.core.kafka.errors import kafka_errors


def test_a_kafka_exception_becomes_a_stateful_error_with_its_code():
    with pytest.raises(KafkaOperationError) as raised, kafka_errors("reading offsets of orders[3]"):
        raise KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED, "not allowed"))

    error = raised.value
    assert isinstance(error, StatefulError) and isinstance(error.__cause__, KafkaException)
    assert error.code == KafkaError.GROUP_AUTHORIZATION_FAILED and error.code_name == "GROUP_AUTHORIZATION_FAILED"
    assert not error.retriable
    assert "reading offsets of orders[3]" in str(error) and "not allowed" in str(error)


def test_a_broker_refusal_reaches_the_caller_as_a_stateful_error(kafka_bootstrap, unique_name, tmp_path):
    from core_helpers import totals_app

    source = unique_name("orders")
    create_topic(kafka_bootstrap, source, partitions=1)
    app = totals_app(
        kafka_bootstrap, source, tmp_path, unique_name("totals"), changelog_config={"segment.ms": "not-a-number"}
    )

    with pytest.raises(KafkaOperationError) as raised:
        app.provision()

    assert raised.value.code == KafkaError.INVALID_CONFIG, str(raised.value)
    assert app.name in str(raised.value) and "segment.ms" in str(raised.value)
