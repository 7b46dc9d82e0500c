"""Kafka's errors leave the engine as `KafkaOperationError`s that keep Kafka's error code; outages and a
cluster not ready yet are told apart from refusals."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException
from support.kafka_helpers import create_topic

from dagster_stateful.core import KafkaOperationError, StatefulError
from dagster_stateful.core.kafka.clients import ADMIN_TIMEOUT, KafkaClients
from dagster_stateful.core.kafka.error_codes import gave_up_error, is_transient, kafka_errors
from dagster_stateful.errors import ConfigurationError


def test_a_kafka_exception_becomes_a_stateful_error_with_its_code():
    with pytest.raises(KafkaOperationError) as raised, kafka_errors("reading offsets of orders[3]"):
        raise KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED, "not allowed"))

    error = raised.value
    assert isinstance(error, StatefulError) and isinstance(error.__cause__, KafkaException)
    assert error.code == KafkaError.GROUP_AUTHORIZATION_FAILED and error.code_name == "GROUP_AUTHORIZATION_FAILED"
    assert not error.retriable
    assert "reading offsets of orders[3]" in str(error) and "not allowed" in str(error)


def test_a_broker_refusal_reaches_the_caller_as_a_stateful_error(kafka_bootstrap, unique_name, tmp_path):
    from support.core_helpers import totals_app

    source = unique_name("orders")
    create_topic(kafka_bootstrap, source, partitions=1)
    app = totals_app(
        kafka_bootstrap, source, tmp_path, unique_name("totals"), changelog_config={"segment.ms": "not-a-number"}
    )

    with pytest.raises(KafkaOperationError) as raised:
        app.provision()

    assert raised.value.code == KafkaError.INVALID_CONFIG, str(raised.value)
    assert app.name in str(raised.value) and "segment.ms" in str(raised.value)


@pytest.mark.parametrize(
    "code",
    [
        KafkaError._NOENT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    ],
)
def test_outages_and_clusters_not_ready_yet_are_worth_waiting_out(code):
    assert is_transient(KafkaException(KafkaError(code)))


@pytest.mark.parametrize(
    "code", [KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.INVALID_CONFIG, KafkaError.TOPIC_ALREADY_EXISTS]
)
def test_refusals_are_not_retried(code):
    assert not is_transient(KafkaException(KafkaError(code)))


def test_giving_up_on_an_outage_says_how_long_the_brokers_were_unreachable():
    error = gave_up_error(
        KafkaError(KafkaError._NOENT, "No leaders found"), "listing offsets of orders partitions [0, 1]", "b:9092", 45
    )

    assert error.retriable and error.code == KafkaError._NOENT and error.code_name == "_NOENT"
    message = str(error)
    assert message.startswith("the Kafka brokers at b:9092 were unreachable for 45 s while listing offsets of orders")
    assert "No leaders found" in message and "admin_timeout_seconds" in message


def test_the_admin_timeout_must_be_positive():
    with pytest.raises(ConfigurationError, match="admin_timeout_seconds"):
        KafkaClients({"bootstrap.servers": "127.0.0.1:9"}, admin_timeout_seconds=0)
    assert KafkaClients({"bootstrap.servers": "127.0.0.1:9"}).admin_timeout_seconds == ADMIN_TIMEOUT
