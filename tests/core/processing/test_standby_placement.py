"""Standby placement from the group's assignment: each partition's standbys are the members that
would own it next under cooperative-sticky (checked against the real assignor by
tests/faults/test_standbys.py), never its owner, as many as asked while members remain."""

from __future__ import annotations

import pytest

from dagster_stateful.core.processing.standbys.placement import (
    StandbyChanges,
    standby_changes,
    standby_placement,
    standbys_of,
    successors,
)

THREE = {"m0-a": [0, 3], "m1-b": [1, 4], "m2-c": [2, 5]}


def test_a_departed_members_partitions_go_highest_first_to_the_least_loaded_then_lowest_id():
    # Observed on a broker: m0 leaves; 3 goes to m1 (both others hold 2, m1 sorts first), then 0 to m2.
    assert successors(THREE, "m0-a") == {3: "m1-b", 0: "m2-c"}
    assert successors({"m0": [5, 6], "m1": [1, 4], "m2": [0, 3], "m3": [2]}, "m2") == {3: "m3", 0: "m0"}


def test_each_partition_gets_one_standby_on_a_member_that_does_not_own_it():
    placement = standby_placement(THREE, replicas=1)

    assert set(placement) == set(range(6))
    owner = {p: m for m, ps in THREE.items() for p in ps}
    assert all(len(holders) == 1 and owner[p] not in holders for p, holders in placement.items())
    assert sorted(len(standbys_of(m, THREE, 1)) for m in THREE) == [2, 2, 2], "spread evenly"


def test_a_second_standby_is_where_the_partition_goes_if_the_first_one_also_leaves():
    placement = standby_placement(THREE, replicas=2)

    for partition, holders in placement.items():
        owner = next(m for m, ps in THREE.items() if partition in ps)
        assert len(holders) == 2 and len(set(holders)) == 2 and owner not in holders


@pytest.mark.parametrize("replicas", [1, 2, 5])
def test_there_are_never_more_standbys_than_other_members(replicas):
    pair = {"m0": [0, 1], "m1": [2]}

    assert all(len(holders) == min(replicas, 1) for holders in standby_placement(pair, replicas).values())
    assert standby_placement({"alone": [0, 1]}, replicas) == {0: [], 1: []}


def test_an_idle_member_takes_the_departed_members_partitions_first():
    assert successors({"m0": [0, 1], "m1": [2, 3], "m2": []}, "m0") == {1: "m2", 0: "m2"}


def test_a_standby_whose_partition_the_group_just_gave_this_member_waits_for_the_handover():
    # m0 left; the group's description already gives m1 partition 3, whose standby m1 keeps, but the
    # assignment has not reached m1's worker yet: closing the standby now would make its takeover a
    # plain restore instead of a standby's.
    after = {"m1-b": [1, 4, 3], "m2-c": [2, 5, 0]}

    placement = standby_placement(after, 1)
    waiting = standby_changes("m1-b", placement, after, held=[1, 4], kept=[3, 0])
    assert waiting == StandbyChanges(keep=[2, 5], drop=[]), "m1 keeps m2's partitions, and 3 till its handover"
    handed_over = standby_changes("m1-b", placement, after, held=[1, 4, 3], kept=[0, 2, 5])
    assert handed_over == StandbyChanges(keep=[], drop=[])


def test_a_member_starts_the_standbys_it_is_given_and_closes_those_it_no_longer_keeps():
    mine = standbys_of("m1-b", THREE, 1)

    placement = standby_placement(THREE, 1)
    changes = standby_changes("m1-b", placement, THREE, held=[1, 4], kept=[5])
    assert changes.keep == [p for p in mine if p != 5]
    assert changes.drop == ([] if 5 in mine else [5])
    assert standby_changes("m1-b", placement, THREE, held=[1, 4], kept=mine) == StandbyChanges(keep=[], drop=[])


POOLS = {"a-0": [0, 4], "a-1": [1, 5], "b-0": [2, 6], "b-1": [3, 7]}
HOSTS = {"a-0": "app@host-a:/state", "a-1": "app@host-a:/state", "b-0": "app@host-b:/state", "b-1": "app@host-b:/state"}


def test_a_pools_partitions_are_kept_as_standbys_by_the_other_hosts_pool_evenly():
    placement = standby_placement(POOLS, 1, HOSTS)

    owner_host = {p: HOSTS[m] for m, ps in POOLS.items() for p in ps}
    assert all(len(holders) == 1 and HOSTS[holders[0]] != owner_host[p] for p, holders in placement.items())
    assert sorted(len(standbys_of(m, POOLS, 1, HOSTS)) for m in POOLS) == [2, 2, 2, 2]
    assert standby_placement(POOLS, 2, HOSTS) == placement, "two hosts hold at most one standby"


def test_a_standby_is_where_the_partition_goes_when_its_whole_host_leaves():
    placement = standby_placement(POOLS, 1, HOSTS)

    moved = successors(POOLS, ["a-0", "a-1"])
    assert {p: placement[p][0] for p in moved} == moved


def test_members_of_one_host_alone_keep_no_standbys_of_each_other():
    one_host = {m: ps for m, ps in POOLS.items() if m.startswith("a")}

    assert standby_placement(one_host, 1, HOSTS) == {0: [], 4: [], 1: [], 5: []}
