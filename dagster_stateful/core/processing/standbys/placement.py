"""Which members of a consumer group keep standby copies of which partitions.

Owns `standby_placement`: from the group's current assignment (member id -> the source partitions
it owns), each partition's standbys are the members that would own it next. Kafka Streams places
active tasks on caught-up standbys with an assignor of its own; librdkafka takes no assignor from
Python, so the placement follows the group's assignor instead. When a member leaves,
cooperative-sticky keeps every other member's partitions and hands the departed member's out one
at a time, highest partition first, each to the member holding the fewest (ties: the lowest member
id; a static member's id starts with its static id).

Members of one client (the same client id: one host and state directory, such as the members of a
worker pool) share their stores, so, as Kafka Streams never places a standby on the instance of
its active task, a partition's standbys are kept by other clients only. Its first standby is the
member that would receive it if its owner's whole client left; its second, the one that would
receive it if that member's client left too; and so on. With one member per client this is the
member that would receive it if its owner left. Every member computes the same placement from the
same group description, so no coordination is needed.

`standby_changes` turns a placement into what one member opens and closes. A standby of a partition
the group has just given this member is kept until the assignment reaches the worker (the group's
description shows it first), so that it becomes the active store rather than being closed a moment
before.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from dagster_stateful.core.kafka.descriptions import GroupMember

Assignment = Mapping[str, Sequence[int]]
"""member id -> the partitions it owns."""
Clients = Mapping[str, str]
"""member id -> its client (members of one client share a state directory)."""


def standby_placement(assignment: Assignment, replicas: int, clients: Clients | None = None) -> dict[int, list[str]]:
    """partition -> the members that keep its standbys, in failover order (at most `replicas`,
    fewer when the group has too few other clients). `clients`: by default, each member its own."""
    client_of = dict(clients or {})
    for member in assignment:
        client_of.setdefault(member, member)
    placement: dict[int, list[str]] = {}
    for owner, partitions in assignment.items():
        for partition in partitions:
            placement[partition] = _failover_chain(assignment, client_of, owner, partition, replicas)
    return placement


def group_standby_placement(members: Sequence[GroupMember], replicas: int) -> dict[int, list[str]]:
    """`standby_placement` for a described group, its members grouped by client id."""
    assignment = {member.member_id: member.partitions for member in members}
    return standby_placement(assignment, replicas, {member.member_id: member.client_id for member in members})


def standbys_of(member: str, assignment: Assignment, replicas: int, clients: Clients | None = None) -> list[int]:
    """The partitions `member` keeps standbys of, ascending."""
    placement = standby_placement(assignment, replicas, clients)
    return sorted(partition for partition, holders in placement.items() if member in holders)


@dataclass(frozen=True)
class StandbyChanges:
    """What one member does with its standbys after reading the group's membership."""

    keep: list[int]
    """Partitions to start keeping standbys of, ascending."""
    drop: list[int]
    """Partitions whose standbys to close, ascending."""


def standby_changes(
    member: str,
    placement: Mapping[int, Sequence[str]],
    assignment: Assignment,
    held: Collection[int],
    kept: Collection[int],
) -> StandbyChanges:
    """From the group's assignment and the standby placement made of it: the standbys `member`
    starts and stops keeping, given the partitions its worker holds actively and those it keeps
    standbys of."""
    wanted = {partition for partition, holders in placement.items() if member in holders} - set(held)
    incoming = set(assignment.get(member, ())) - set(held)
    return StandbyChanges(keep=sorted(wanted - set(kept)), drop=sorted(set(kept) - wanted - incoming))


def successors(assignment: Assignment, departed: str | Collection[str]) -> dict[int, str]:
    """Where the departed members' partitions go when they leave the group: highest first, each to
    the remaining member that holds the fewest partitions at that moment (ties: lowest member id)."""
    gone = {departed} if isinstance(departed, str) else set(departed)
    loads = {member: len(partitions) for member, partitions in assignment.items() if member not in gone}
    moved: dict[int, str] = {}
    if not loads:
        return moved
    orphans = [partition for member in gone for partition in assignment.get(member, ())]
    for partition in sorted(orphans, reverse=True):
        receiver = min(loads, key=lambda member: (loads[member], member))
        moved[partition] = receiver
        loads[receiver] += 1
    return moved


def _failover_chain(
    assignment: Assignment, client_of: Mapping[str, str], owner: str, partition: int, replicas: int
) -> list[str]:
    chain: list[str] = []
    current = {member: list(partitions) for member, partitions in assignment.items()}
    while len(chain) < replicas:
        departing = {member for member in current if client_of[member] == client_of[owner]}
        if len(departing) == len(current):
            break
        moved = successors(current, departing)
        receiver = moved[partition]
        chain.append(receiver)
        for member in departing:
            del current[member]
        for moved_partition, member in moved.items():
            current[member].append(moved_partition)
        owner = receiver
    return chain
