"""The one ACL model: Kafka's resource types, pattern types and operations, and `AclRequirement`.

Owns the vocabulary every part of the project names an ACL in: `ResourceType`, `PatternType`,
`Operation` (spelled as `kafka-acls` takes them), `CLUSTER_NAME` and `AclRequirement` (an operation
on a resource, literal or by prefix, and why the app needs it). `acls` derives the least-privilege
table from an app's configuration in these terms; `authorization` names, in the same terms, what
each part of a worker needs and which of it Kafka refused. A leaf: it imports nothing of the
project, so both can use it without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["CLUSTER_NAME", "AclRequirement", "Operation", "PatternType", "ResourceType"]


class ResourceType(StrEnum):
    """A kind of resource Kafka's ACLs protect, as `kafka-acls --<type>` names it."""

    TOPIC = "topic"
    GROUP = "group"
    TRANSACTIONAL_ID = "transactional-id"
    CLUSTER = "cluster"


class PatternType(StrEnum):
    """How an ACL's resource name matches: exactly, or every name starting with it."""

    LITERAL = "literal"
    PREFIXED = "prefixed"


class Operation(StrEnum):
    """An ACL operation, as `kafka-acls --operation` takes it."""

    READ = "Read"
    WRITE = "Write"
    CREATE = "Create"
    DESCRIBE = "Describe"
    DESCRIBE_CONFIGS = "DescribeConfigs"
    DELETE = "Delete"
    IDEMPOTENT_WRITE = "IdempotentWrite"


CLUSTER_NAME = "kafka-cluster"
"""The name of Kafka's one cluster resource."""


@dataclass(frozen=True)
class AclRequirement:
    """An ACL the app needs: `operation` on the `resource_type` named `name` (every name starting
    with it when `pattern` is PREFIXED). `why` says what for; it is left out of comparisons, so the
    same ACL needed for two reasons is one ACL."""

    resource_type: ResourceType
    name: str
    operation: Operation
    pattern: PatternType = PatternType.LITERAL
    why: str = field(default="", compare=False)

    def __str__(self) -> str:
        names = f"names starting with {self.name!r}" if self.pattern is PatternType.PREFIXED else self.name
        return f"{self.operation} on {self.resource_type} {names}"
