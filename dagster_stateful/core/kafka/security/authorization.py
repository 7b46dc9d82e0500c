"""Authorization failures: what the engine was doing, which ACL that needs, and what to grant.

Owns what each part of a worker needs, as `AclRequirement`s of the one ACL model (`acl_model`):
`consuming`, `producing`, `transacting` (the same ACLs `acls.required_acls` lists for the app, no
more: a test holds them to it), and the error raised when Kafka refuses one
(`authorization_error`): "not authorized: <operation> on <resource type> <name>", naming what the
engine was doing and pointing to `dagster-stateful acls`, which prints every ACL an app needs.
Kafka's *_AUTHORIZATION_FAILED codes are never retried: an ACL does not appear by waiting.
"""

from __future__ import annotations

from collections.abc import Sequence

from confluent_kafka import KafkaError

from dagster_stateful.core.config import AppConfig, ErrorPolicy
from dagster_stateful.core.kafka.security.acl_model import (
    CLUSTER_NAME,
    AclRequirement,
    Operation,
    PatternType,
    ResourceType,
)
from dagster_stateful.errors import KafkaAuthorizationError

REFUSED_RESOURCE: dict[int, str] = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: ResourceType.TOPIC,
    KafkaError.GROUP_AUTHORIZATION_FAILED: ResourceType.GROUP,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: ResourceType.TRANSACTIONAL_ID,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: ResourceType.CLUSTER,
    KafkaError.DELEGATION_TOKEN_AUTHORIZATION_FAILED: "delegation token",
}
"""Kafka's authorization codes, with the type of resource each one refuses."""
IDEMPOTENT_WRITE = AclRequirement(
    ResourceType.CLUSTER, CLUSTER_NAME, Operation.IDEMPOTENT_WRITE, why="an idempotent producer, on brokers before 3.0"
)
"""Not in the least-privilege table (brokers of Kafka 3.0 and later let an idempotent producer write
with Write on a topic, KIP-679), but what an older broker, or one refusing the producer's id,
names: recognized in Kafka's refusal by its text."""
UNKNOWN_PRINCIPAL = (
    "its principal (User:<sasl.username>; under mutual TLS, the name the brokers map its certificate to)"
)
ACLS_HINT = (
    "`dagster-stateful acls MODULE:APP --principal {principal}` prints every ACL the app needs, as kafka-acls "
    "commands: have them granted to the app's principal."
)


def is_authorization_failure(error: KafkaError) -> bool:
    return error.code() in REFUSED_RESOURCE


def consuming(config: AppConfig) -> tuple[AclRequirement, ...]:
    """What a worker's consumer needs: joining the app's group and reading its inputs."""
    return (
        *(AclRequirement(ResourceType.TOPIC, topic, Operation.READ, why="consume it") for topic in config.input_topics),
        *(
            AclRequirement(ResourceType.TOPIC, topic, Operation.READ, why="read the global table")
            for topic in (*config.global_tables.values(), *config.tables.values())
        ),
        AclRequirement(ResourceType.GROUP, config.consumer_group, Operation.READ, why="join the group"),
    )


def producing(config: AppConfig) -> tuple[AclRequirement, ...]:
    """What a worker's producer needs: writing its changelogs, output and dead letters (an
    idempotent producer: Kafka 3.0 and later need no IdempotentWrite on the cluster for it)."""
    topics = [*(config.changelog_topics() or {}).values()]
    if config.repartition_topic is not None:
        topics.append(config.repartition_topic)
    if config.output and config.emits_output:
        topics.append(config.output)
    if config.on_error is ErrorPolicy.DEAD_LETTER:
        topics.append(config.dead_letter_topic)
    return tuple(AclRequirement(ResourceType.TOPIC, topic, Operation.WRITE, why="produce to it") for topic in topics)


def transacting(config: AppConfig, transactional_id_prefix: str) -> tuple[AclRequirement, ...]:
    """What an exactly-once worker's transactional producer needs, its transactional ids included."""
    ids = AclRequirement(
        ResourceType.TRANSACTIONAL_ID, transactional_id_prefix, Operation.WRITE, PatternType.PREFIXED, "transactions"
    )
    return ids, *producing(config)


def authorization_error(
    error: KafkaError, doing: str, needs: Sequence[AclRequirement] = (), principal: str | None = None
) -> KafkaAuthorizationError:
    """The error for Kafka's refusal `error` (an *_AUTHORIZATION_FAILED code) while `doing`: "not
    authorized: <what was refused>", named by the ACLs in `needs` of the refused resource type
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
        operation=None if only is None else str(only.operation),
        resource_type=str(resource_type),
        resource_name=None if only is None else only.name,
    )


def _refused(error: KafkaError, resource_type: str, needs: Sequence[AclRequirement]) -> list[AclRequirement]:
    """The ACLs of `needs` that Kafka's refusal may be about (the cluster's IdempotentWrite, needed
    by none of them, is recognized by librdkafka's text alone)."""
    refused = [acl for acl in needs if acl.resource_type == resource_type]
    if not refused and resource_type == ResourceType.CLUSTER and "idempotence" in error.str().lower():
        refused = [IDEMPOTENT_WRITE]
    return refused


def _describe(refused: list[AclRequirement], resource_type: str) -> str:
    if not refused:
        return f"an operation on a {resource_type}"
    described = " or ".join(str(acl) for acl in refused)
    if any(acl.operation is Operation.IDEMPOTENT_WRITE for acl in refused):
        described += " (brokers of Kafka 3.0 or later also accept Write on any topic instead)"
    return described
