"""Where a key's state lives in a running group (Kafka Streams' `queryMetadataForKey`).

Owns `KeyLocation` and `locate_key`: the key's source partition (the key serialized as messages
carry it, placed by the producers' partitioner), the member that owns that partition actively,
from the group's description (its static id, client id and host), and the members that keep its
standby replicas, placed as every worker places them (`processing.standby_placement`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.kafka.descriptions import GroupMember
from dagster_stateful.core.kafka.partitioner import Partitioner, partition_of
from dagster_stateful.core.processing.standbys.placement import group_standby_placement
from dagster_stateful.errors import ConfigurationError


@dataclass(frozen=True)
class KeyLocation:
    store: str
    key: Any
    partition: int
    active: GroupMember | None
    """The member that owns the partition (None: no member does, the group is not running or rebalancing)."""
    standbys: tuple[GroupMember, ...]
    """The members that keep the partition's standby replicas, in failover order."""
    members: tuple[GroupMember, ...] = ()
    """Every member of the group (one that neither owns the partition nor keeps its standby may
    still hold an older copy, from an earlier assignment)."""

    def describe(self) -> str:
        active = (
            member_name(self.active) if self.active else "no active owner (the group is not running or rebalancing)"
        )
        standbys = ", ".join(member_name(member) for member in self.standbys) or "none"
        where = f"partition {self.partition}, active {active}, standbys {standbys}"
        return f"key {self.key!r} of store {self.store!r}: {where}"


def locate_key(
    config: AppConfig, kafka: KafkaClients, store: str, key: Any, partitioner: Partitioner = "murmur2"
) -> KeyLocation:
    """Where `key` (a message key, as the app's key serializer takes it) of `store` lives now."""
    if store not in config.stores:
        raise ConfigurationError(f"unknown store {store!r}; app {config.name!r} declares {list(config.stores)}")
    partitions = kafka.partition_count(config.task_topic)
    if not partitions:
        raise ConfigurationError(f"source topic {config.task_topic!r} of app {config.name!r} does not exist")
    partition = partition_of(config.key_serde.dumps(key), partitions, partitioner)
    group = kafka.describe_group(config.consumer_group, config.task_topic)
    by_id = {member.member_id: member for member in group.members}
    active = next((member for member in group.members if partition in member.partitions), None)
    holders: list[str] = []
    if active is not None and config.num_standby_replicas:
        holders = group_standby_placement(group.members, config.num_standby_replicas).get(partition, [])
    standbys = tuple(by_id[member_id] for member_id in holders)
    return KeyLocation(store, key, partition, active, standbys, group.members)


def member_name(member: GroupMember) -> str:
    identity = member.group_instance_id or member.client_id
    return f"{identity} on {member.host.lstrip('/')}"
