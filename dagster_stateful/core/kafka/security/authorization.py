"""Authorization failures: what the engine was doing, which ACL that needs, and what to grant.

Owns `Access` (an ACL operation on a resource: READ on group G, WRITE on topic T, ...), the ones
each part of a worker needs (`consuming`, `producing`, `transacting`), and the error raised when
Kafka refuses one (`authorization_error`): "not authorized: <operation> on <resource type> <name>",
naming what the engine was doing and pointing to `dagster-stateful acls`, which prints every ACL an
app needs. Kafka's *_AUTHORIZATION_FAILED codes are never retried: an ACL does not appear by
waiting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaError

from dagster_stateful.core.config import AppConfig, ErrorPolicy
from dagster_stateful.errors import KafkaAuthorizationError

TOPIC, GROUP, TRANSACTIONAL_ID, CLUSTER = "topic", "group", "transactional-id", "cluster"
CLUSTER_NAME = "kafka-cluster"
"""The one cluster resource's name in Kafka's ACLs."""
REFUSED_RESOURCE = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: TOPIC,
    KafkaError.GROUP_AUTHORIZATION_FAILED: GROUP,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: TRANSACTIONAL_ID,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: CLUSTER,
    KafkaError.DELEGATION_TOKEN_AUTHORIZATION_FAILED: "delegation token",
}
"""Kafka's authorization codes, with the type of resource each one refuses."""
UNKNOWN_PRINCIPAL = (
    "its principal (User:<sasl.username>; under mutual TLS, the name the brokers map its certificate to)"
)
ACLS_HINT = (
    "`dagster-stateful acls MODULE:APP --principal {principal}` prints every ACL the app needs, as kafka-acls "
    "commands: have them granted to the app's principal."
)


@dataclass(frozen=True)
class Access:
    """What an operation of the engine needs an ACL for."""

    operation: str
    """Kafka's ACL operation as `kafka-acls --operation` takes it: Read, Write, Create, Describe,
    DescribeConfigs, IdempotentWrite."""
    resource_type: str
    name: str
    prefixed: bool = False
    """The engine uses names starting with `name` (a PREFIXED ACL covers them)."""

    def __str__(self) -> str:
        names = f"names starting with {self.name!r}" if self.prefixed else self.name
        return f"{self.operation} on {self.resource_type} {names}"


def is_authorization_failure(error: KafkaError) -> bool:
    return error.code() in REFUSED_RESOURCE


def consuming(config: AppConfig) -> tuple[Access, ...]:
    """What a worker's consumer needs: joining the app's group and reading its source."""
    return Access("Read", TOPIC, config.source), Access("Read", GROUP, config.consumer_group)


def producing(config: AppConfig) -> tuple[Access, ...]:
    """What a worker's producer needs: writing its changelogs, output and dead letters, and (an
    idempotent producer; Kafka 3+ also accepts Write on any topic) IdempotentWrite on the cluster."""
    topics = [*(config.changelog_topics() or {}).values()]
    if config.output and config.emits_output:
        topics.append(config.output)
    if config.on_error is ErrorPolicy.DEAD_LETTER:
        topics.append(config.dead_letter_topic)
    return (*(Access("Write", TOPIC, topic) for topic in topics), Access("IdempotentWrite", CLUSTER, CLUSTER_NAME))


def transacting(config: AppConfig, transactional_id_prefix: str) -> tuple[Access, ...]:
    """What an exactly-once worker's transactional producer needs, its transactional ids included."""
    return Access("Write", TRANSACTIONAL_ID, transactional_id_prefix, prefixed=True), *producing(config)


def authorization_error(
    error: KafkaError, doing: str, needs: Sequence[Access] = (), principal: str | None = None
) -> KafkaAuthorizationError:
    """The error for Kafka's refusal `error` (an *_AUTHORIZATION_FAILED code) while `doing`: "not
    authorized: <what was refused>", named by the accesses in `needs` of the refused resource type
    (several: any of them may be the one missing). `principal`: the client's, when known."""
    resource_type = REFUSED_RESOURCE.get(error.code(), "resource")
    refused = _refused(error, resource_type, needs)
    lacking = "the ACL" if refused else f"an ACL on the {resource_type}"
    message = (
        f"not authorized: {_describe(refused, resource_type)}, while {doing} (Kafka: {error.name()}, "
        f"{error.str()}). Kafka authenticated the client, but {principal or UNKNOWN_PRINCIPAL} lacks {lacking}. "
        + ACLS_HINT.format(principal=principal or "User:NAME")
    )
    only = refused[0] if len(refused) == 1 else None
    return KafkaAuthorizationError(
        message,
        code=error.code(),
        code_name=error.name(),
        operation=None if only is None else only.operation,
        resource_type=resource_type,
        resource_name=None if only is None else only.name,
    )


def _refused(error: KafkaError, resource_type: str, needs: Sequence[Access]) -> list[Access]:
    """The accesses of `needs` that Kafka's refusal may be about (the cluster's IdempotentWrite is
    recognized by librdkafka's text alone)."""
    refused = [access for access in needs if access.resource_type == resource_type]
    if not refused and resource_type == CLUSTER and "idempotence" in error.str().lower():
        refused = [Access("IdempotentWrite", CLUSTER, CLUSTER_NAME)]
    return refused


def _describe(refused: list[Access], resource_type: str) -> str:
    if not refused:
        return f"an operation on a {resource_type}"
    described = " or ".join(str(access) for access in refused)
    if any(access.operation == "IdempotentWrite" for access in refused):
        described += " (brokers of Kafka 3.0 or later also accept Write on any topic instead)"
    return described
