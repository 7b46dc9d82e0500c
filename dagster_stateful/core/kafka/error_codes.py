"""How Kafka's errors become the project's: `KafkaOperationError`, with Kafka's error code kept.

Owns `kafka_errors`, the context manager the core's entry points run under, so that no raw
`confluent_kafka.KafkaException` escapes the engine: the caller gets a `StatefulError` saying what
the engine was doing, with librdkafka's code, its name and whether it is retriable. Also owns the
judgement of which errors are worth waiting out (`is_transient`: a broker down or unreachable, a
partition without a leader yet, a coordinator still loading) and the error raised when waiting did
not help (`gave_up_error`). Kafka's refusals of an ACL become `KafkaAuthorizationError`s (see
`authorization`), never retried.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from confluent_kafka import KafkaError, KafkaException

from dagster_stateful.core.kafka.security.acl_model import AclRequirement
from dagster_stateful.core.kafka.security.authorization import authorization_error, is_authorization_failure
from dagster_stateful.errors import KafkaOperationError

UNREACHABLE = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError._RESOLVE,
        KafkaError._NOENT,  # list_offsets: "No leaders found", also when the leader's broker is down
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.BROKER_NOT_AVAILABLE,
    }
)
"""Codes that mean the brokers (or the partition's leader) could not be reached."""
NOT_READY = frozenset(
    {
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,  # NOT_LEADER_OR_FOLLOWER in Kafka's newer names
        KafkaError.REPLICA_NOT_AVAILABLE,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError._WAIT_COORD,
    }
)
"""Codes of a cluster that answers but is not ready yet: a new partition without a leader, a
leader moving, a coordinator loading."""
STALE_METADATA = frozenset(
    {
        KafkaError._NOENT,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
    }
)
"""Codes after which a client's cached leaders and leader epochs may be out of date (a new topic, a
restarted broker): the admin client keeps sending stale epochs until its metadata is refreshed."""


def kafka_error_of(error: KafkaException) -> KafkaError | None:
    return error.args[0] if error.args and isinstance(error.args[0], KafkaError) else None


def is_transient(error: KafkaException) -> bool:
    """Whether waiting and trying again may help: Kafka says so, or the code is one of the above (a
    refused ACL never is)."""
    kafka_error = kafka_error_of(error)
    return (
        kafka_error is not None
        and not is_authorization_failure(kafka_error)
        and (kafka_error.retriable() or kafka_error.code() in UNREACHABLE or kafka_error.code() in NOT_READY)
    )


def as_operation_error(
    error: KafkaException, what: str, needs: Sequence[AclRequirement] = (), principal: str | None = None
) -> KafkaOperationError:
    """The project's error for `error`, met while `what`; an authorization failure names the access
    in `needs` that Kafka refused (see `authorization.authorization_error`)."""
    kafka_error = kafka_error_of(error)
    if kafka_error is None:
        return KafkaOperationError(f"Kafka failed while {what}: {error}")
    if is_authorization_failure(kafka_error):
        return authorization_error(kafka_error, what, needs, principal)
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


def gave_up_error(last: KafkaError, what: str, bootstrap: str, waited: float) -> KafkaOperationError:
    """The error after transient failures lasted the whole deadline (`waited` seconds): retriable, since
    a later run may find the cluster back."""
    found = f"last error {last.name()} ({last.code()}): {last.str()}"
    if last.code() in UNREACHABLE:
        message = (
            f"the Kafka brokers at {bootstrap} were unreachable for {waited:g} s while {what} ({found}). "
            "Check that the brokers run and that this machine reaches them, then run again; to wait out "
            "longer outages, give KafkaClients a larger admin_timeout_seconds."
        )
    else:
        message = (
            f"Kafka at {bootstrap} was not ready for {waited:g} s while {what} ({found}). "
            "Check the brokers' health (leaders, coordinators) and run again."
        )
    return KafkaOperationError(message, code=last.code(), code_name=last.name(), retriable=True)


@contextmanager
def kafka_errors(what: str) -> Iterator[None]:
    """Re-raise a `KafkaException` from the block as a `KafkaOperationError` about `what`."""
    try:
        yield
    except KafkaException as error:
        raise as_operation_error(error, what) from error
