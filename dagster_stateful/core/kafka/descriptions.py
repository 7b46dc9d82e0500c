"""What the admin reads describe: a topic's layout (partitions, replication) and a consumer
group's state and members, with the partitions each member owns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GroupMember:
    member_id: str
    client_id: str
    host: str
    group_instance_id: str | None
    partitions: tuple[int, ...]
    """Partitions of the topic asked about that this member owns."""


@dataclass(frozen=True)
class GroupDescription:
    group: str
    state: str
    """Kafka's group state: STABLE, PREPARING_REBALANCE, COMPLETING_REBALANCE, EMPTY, DEAD, UNKNOWN."""
    members: tuple[GroupMember, ...]

    def owners(self) -> dict[int, str]:
        """Partition -> a stable name of the member that owns it (instance id, else client@host)."""
        return {
            p: member.group_instance_id or f"{member.client_id}@{member.host}/{member.member_id[-8:]}"
            for member in self.members
            for p in member.partitions
        }


@dataclass(frozen=True)
class TopicLayout:
    partitions: int
    replication_factor: int
    """Replicas of the topic's least replicated partition."""
