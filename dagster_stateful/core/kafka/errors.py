"""How Kafka's errors become the project's: `KafkaOperationError`, with Kafka's error code kept.

Owns `kafka_errors`, the context manager the core's entry points run under, so that no raw
`confluent_kafka.KafkaException` escapes the engine: the caller gets a `StatefulError` saying what
the engine was doing, with librdkafka's code, its name and whether it is retriable.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka import KafkaError, KafkaException

from dagster_stateful.errors import KafkaOperationError


def as_operation_error(error: KafkaException, what: str) -> KafkaOperationError:
    kafka_error = error.args[0] if error.args and isinstance(error.args[0], KafkaError) else None
    if kafka_error is None:
        return KafkaOperationError(f"Kafka failed while {what}: {error}")
    advice = (
        "Kafka says a retry may succeed: check that the brokers are reachable and run again."
        if kafka_error.retriable()
        else "Check the brokers, the topics and the client settings."
    )
    return KafkaOperationError(
        f"Kafka failed while {what}: {kafka_error.name()} ({kafka_error.code()}): {kafka_error.str()}. {advice}",
        code=kafka_error.code(),
        code_name=kafka_error.name(),
        retriable=kafka_error.retriable(),
    )


@contextmanager
def kafka_errors(what: str) -> Iterator[None]:
    """Re-raise a `KafkaException` from the block as a `KafkaOperationError` about `what`."""
    try:
        yield
    except KafkaException as error:
        raise as_operation_error(error, what) from error
