"""Which members of a consumer group keep standby copies of which partitions.

Owns `standby_placement`: from the group's current assignment (member id -> the source partitions
it owns), each partition's standbys are the members that would own it next. Kafka Streams places
active tasks on caught-up standbys with an assignor of its own; librdkafka takes no assignor from
Python, so the placement follows the group's assignor instead. When a member leaves,
cooperative-sticky keeps every other member's partitions and hands the departed member's out one
at a time, highest partition first, each to the member holding the fewest (ties: the lowest member
id; a static member's id starts with its static id). A partition's first standby is the member
that would receive it if its owner left; its second, the one that would receive it if that member
left too; and so on. Every member computes the same placement from the same group description, so
no coordination is needed, and a member never keeps a standby of a partition it owns.

`standby_changes` turns a placement into what one member opens and closes. A standby of a partition
the group has just given this member is kept until the assignment reaches the worker (the group's
description shows it first), so that it becomes the active store rather than being closed a moment
before.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

Assignment = Mapping[str, Sequence[int]]
"""member id -> the partitions it owns."""


def standby_placement(assignment: Assignment, replicas: int) -> dict[int, list[str]]:
    """partition -> the members that keep its standbys, in failover order (at most `replicas`,
    fewer when the group has too few other members)."""
    placement: dict[int, list[str]] = {}
    for owner, partitions in assignment.items():
        for partition in partitions:
            placement[partition] = _failover_chain(assignment, owner, partition, replicas)
    return placement


def standbys_of(member: str, assignment: Assignment, replicas: int) -> list[int]:
    """The partitions `member` keeps standbys of, ascending."""
    placement = standby_placement(assignment, replicas)
    return sorted(partition for partition, holders in placement.items() if member in holders)


@dataclass(frozen=True)
class StandbyChanges:
    """What one member does with its standbys after reading the group's membership."""

    keep: list[int]
    """Partitions to start keeping standbys of, ascending."""
    drop: list[int]
    """Partitions whose standbys to close, ascending."""


def standby_changes(
    member: str, assignment: Assignment, replicas: int, held: Collection[int], kept: Collection[int]
) -> StandbyChanges:
    """From the group's assignment: the standbys `member` starts and stops keeping, given the
    partitions its worker holds actively and those it keeps standbys of."""
    wanted = set(standbys_of(member, assignment, replicas)) - set(held)
    incoming = set(assignment.get(member, ())) - set(held)
    return StandbyChanges(keep=sorted(wanted - set(kept)), drop=sorted(set(kept) - wanted - incoming))


def successors(assignment: Assignment, departed: str) -> dict[int, str]:
    """Where the departed member's partitions go when it leaves the group: highest first, each to
    the remaining member that holds the fewest partitions at that moment (ties: lowest member id)."""
    loads = {member: len(partitions) for member, partitions in assignment.items() if member != departed}
    moved: dict[int, str] = {}
    if not loads:
        return moved
    for partition in sorted(assignment.get(departed, ()), reverse=True):
        receiver = min(loads, key=lambda member: (loads[member], member))
        moved[partition] = receiver
        loads[receiver] += 1
    return moved


def _failover_chain(assignment: Assignment, owner: str, partition: int, replicas: int) -> list[str]:
    chain: list[str] = []
    current = {member: list(partitions) for member, partitions in assignment.items()}
    while len(chain) < replicas and len(current) > 1:
        moved = successors(current, owner)
        receiver = moved[partition]
        chain.append(receiver)
        del current[owner]
        for moved_partition, member in moved.items():
            current[member].append(moved_partition)
        owner = receiver
    return chain
