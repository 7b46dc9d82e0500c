"""The Kafka ACLs an app needs, and no more: least privilege on a cluster that denies by default.

Owns `required_acls`, which derives the ACLs (`AclRequirement`s of the one model, `acl_model`)
from an app's configuration and topics: the source topic (read), the changelogs (created by
provisioning, validated, written by every commit, read by restores and by the Spark jobs), the
output and dead-letter topics (created and written), the consumer group (joined, committed to,
read by the sensors), the groups of the changelog replays and, under exactly-once, the
transactional ids (a prefix: one id per worker). Describe is listed only where nothing implies it
(Kafka grants it with Read or Write on the same resource); the cluster's IdempotentWrite is not
listed, since brokers of Kafka 3.0 and later let an idempotent producer write with Write on a topic
(KIP-679; older brokers need it too). What each part of a worker needs (`authorization`) is
contained in it. `kafka_acls_commands` prints them in the form Kafka's `kafka-acls` tool takes,
`markdown_table` as the docs show them, `acl_bindings` as confluent-kafka's `AclBinding`s.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType
from confluent_kafka.admin import ResourceType as KafkaResourceType

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.provisioning import TopicRole, TopicSpec
from dagster_stateful.core.kafka.security.acl_model import AclRequirement, Operation, PatternType, ResourceType

__all__ = ["acl_bindings", "kafka_acls_commands", "markdown_table", "required_acls", "transactional_id_prefix"]


def required_acls(
    config: AppConfig, topics: Iterable[TopicSpec], create_topics: bool | None = None
) -> list[AclRequirement]:
    """Every ACL the app's jobs need (provisioning, workers under its guarantee, restores, the Spark
    jobs and the sensors); `create_topics`: whether it creates its own topics (default: its
    `auto_create_topics`), which needs Create on them."""
    create = config.auto_create_topics if create_topics is None else create_topics
    needed: list[AclRequirement] = []
    for spec in topics:
        needed += _topic_acls(spec, create)
    group = config.consumer_group
    needed += [
        _acl(ResourceType.GROUP, group, Operation.READ, "join the group, commit and read its offsets and members"),
        _acl(ResourceType.GROUP, config.restore_group, Operation.DESCRIBE, "the changelog restores' consumers"),
        _acl(ResourceType.GROUP, config.verify_group, Operation.DESCRIBE, "the changelog verification's consumer"),
    ]
    if config.exactly_once:
        prefix = transactional_id_prefix(config)
        needed += [
            _acl(ResourceType.TRANSACTIONAL_ID, prefix, Operation.WRITE, "run transactions (one id per worker)", True),
        ]
    return needed


def transactional_id_prefix(config: AppConfig) -> str:
    """What every transactional id of the app's workers starts with (see `transactions.transactional_config`)."""
    return f"{config.name}-eos-"


def _topic_acls(spec: TopicSpec, create: bool) -> list[AclRequirement]:
    name = spec.name
    if spec.role is TopicRole.SOURCE:
        return [_acl(ResourceType.TOPIC, name, Operation.READ, "consume it, commit offsets on it, read its offsets")]
    if spec.role in (TopicRole.GLOBAL_TABLE, TopicRole.TABLE):
        reads = (
            "every worker reads the global table whole"
            if spec.role is TopicRole.GLOBAL_TABLE
            else ("a worker reads the table partitions of the tasks it holds")
        )
        return [
            _acl(ResourceType.TOPIC, name, Operation.READ, reads),
            _acl(ResourceType.TOPIC, name, Operation.DESCRIBE_CONFIGS, "provisioning checks cleanup.policy=compact"),
        ]
    needed = [_acl(ResourceType.TOPIC, name, Operation.WRITE, _WRITES[spec.role])]
    if create:
        needed.append(_acl(ResourceType.TOPIC, name, Operation.CREATE, "provisioning creates it when missing"))
    if spec.role is TopicRole.REPARTITION:
        needed += [
            _acl(ResourceType.TOPIC, name, Operation.READ, "the steps after group_by consume it"),
            _acl(ResourceType.TOPIC, name, Operation.DELETE, "committed records are purged (DeleteRecords)"),
        ]
    if spec.role is TopicRole.CHANGELOG:
        needed += [
            _acl(ResourceType.TOPIC, name, Operation.READ, "restores and the Spark jobs replay it"),
            _acl(ResourceType.TOPIC, name, Operation.DESCRIBE_CONFIGS, "provisioning checks cleanup.policy=compact"),
        ]
    return needed


_WRITES = {
    TopicRole.CHANGELOG: "every commit writes the state changes",
    TopicRole.OUTPUT: "the results",
    TopicRole.REPARTITION: "the re-keyed records (group_by)",
    TopicRole.DEAD_LETTER: "messages the steps refuse (on_error='dead-letter')",
}


def _acl(resource: ResourceType, name: str, operation: Operation, why: str, prefixed: bool = False) -> AclRequirement:
    return AclRequirement(resource, name, operation, PatternType.PREFIXED if prefixed else PatternType.LITERAL, why)


def kafka_acls_commands(
    required: Iterable[AclRequirement], principal: str, bootstrap: str, command_config: str
) -> list[str]:
    """`kafka-acls` command lines granting `required` to `principal` (e.g. "User:orders-app"), one
    per resource; `command_config`: the admin client's properties file for a secured cluster."""
    by_resource: dict[tuple[ResourceType, str, PatternType], list[Operation]] = {}
    for acl in required:
        by_resource.setdefault((acl.resource_type, acl.name, acl.pattern), []).append(acl.operation)
    commands = []
    for (resource, name, pattern), operations in by_resource.items():
        words = ["kafka-acls.sh", "--bootstrap-server", bootstrap, "--command-config", command_config, "--add"]
        words += ["--allow-principal", principal]
        for operation in operations:
            words += ["--operation", operation.value]
        words += ["--cluster"] if resource is ResourceType.CLUSTER else [f"--{resource.value}", name]
        if pattern is PatternType.PREFIXED:
            words += ["--resource-pattern-type", "prefixed"]
        commands.append(shlex.join(words))
    return commands


def markdown_table(required: Iterable[AclRequirement]) -> str:
    """The requirements as a Markdown table: resource, pattern, operation, why."""
    rows = ["| resource | pattern | operation | why |", "|---|---|---|---|"]
    rows += [
        f"| {acl.resource_type.value} `{acl.name}` | {acl.pattern.value} | {acl.operation.value} | {acl.why} |"
        for acl in required
    ]
    return "\n".join(rows)


_KAFKA_RESOURCES = {
    ResourceType.TOPIC: KafkaResourceType.TOPIC,
    ResourceType.GROUP: KafkaResourceType.GROUP,
    ResourceType.TRANSACTIONAL_ID: KafkaResourceType.TRANSACTIONAL_ID,
    ResourceType.CLUSTER: KafkaResourceType.BROKER,
}
_KAFKA_OPERATIONS = {
    Operation.READ: AclOperation.READ,
    Operation.WRITE: AclOperation.WRITE,
    Operation.CREATE: AclOperation.CREATE,
    Operation.DESCRIBE: AclOperation.DESCRIBE,
    Operation.DESCRIBE_CONFIGS: AclOperation.DESCRIBE_CONFIGS,
    Operation.IDEMPOTENT_WRITE: AclOperation.IDEMPOTENT_WRITE,
    Operation.DELETE: AclOperation.DELETE,
}


def acl_bindings(required: Iterable[AclRequirement], principal: str, host: str = "*") -> list[AclBinding]:
    """`required` as confluent-kafka's `AclBinding`s allowing `principal`, for `AdminClient.create_acls`."""
    return [
        AclBinding(
            _KAFKA_RESOURCES[acl.resource_type],
            acl.name,
            ResourcePatternType.PREFIXED if acl.pattern is PatternType.PREFIXED else ResourcePatternType.LITERAL,
            principal,
            host,
            _KAFKA_OPERATIONS[acl.operation],
            AclPermissionType.ALLOW,
        )
        for acl in required
    ]
