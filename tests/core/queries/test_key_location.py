"""Where a key lives, as users read it: an unknown store is refused before any broker is asked, and
the description names the partition, the active owner and the standbys (the placement itself is
checked against a live pool by tests/faults/test_standbys.py, with reads that a fresher copy answers
during a restore); a member's copy is found on this host from the state directory its client id names."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dagster_stateful.core import App, ConfigurationError, KeyLocation
from dagster_stateful.core.kafka.descriptions import GroupMember
from dagster_stateful.core.queries.key_reads import member_state_root


def member(instance: str, host: str) -> GroupMember:
    return GroupMember(f"{instance}-0f3c", f"client-{instance}", host, instance, (1,))


def test_an_unknown_store_is_refused_naming_the_apps_stores():
    app = App(name="totals", source="orders", stores=["totals"], kafka="127.0.0.1:9")

    with pytest.raises(ConfigurationError, match=r"unknown store 'counts'; app 'totals' declares \['totals'\]"):
        app.key_location("counts", "c1")


def test_the_description_names_the_partition_the_owner_and_the_standbys_in_failover_order():
    location = KeyLocation("totals", "c1", 4, member("app-pod-0", "/10.0.0.5"), (member("app-pod-2", "/10.0.0.7"),))

    assert location.describe() == (
        "key 'c1' of store 'totals': partition 4, active app-pod-0 on 10.0.0.5, standbys app-pod-2 on 10.0.0.7"
    )
    nobody = KeyLocation("totals", "c1", 4, None, ())
    assert "no active owner (the group is not running or rebalancing)" in nobody.describe()
    assert nobody.describe().endswith("standbys none")


def test_a_member_on_this_host_is_read_from_the_state_directory_its_client_id_names():
    here = GroupMember("m-1", f"totals@{socket.gethostname()}:/var/state/member-1", "/127.0.0.1", None, (2,))
    elsewhere = GroupMember("m-2", "totals@another-host:/var/state/member-2", "/10.0.0.9", None, (3,))
    other_app = GroupMember("m-3", f"counts@{socket.gethostname()}:/var/state/member-3", "/127.0.0.1", None, (4,))

    assert member_state_root(here, "totals") == Path("/var/state/member-1")
    assert member_state_root(elsewhere, "totals") is None
    assert member_state_root(other_app, "totals") is None
