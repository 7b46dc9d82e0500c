"""At-least-once never counts a message twice unless compaction removed a record, whatever a tool,
an expiry, an upgrade or a change of guarantee does to the group's commit metadata (real broker).

Each test leaves the changelog records of a commit whose source offset was never committed (a
worker killed between delivering them and committing), or rewinds the group on purpose, then does
to the group what an operator or the engine itself may do, and restores on a new machine. The
changelog is never compacted here (the broker's default segment.ms), so any total above the one
recomputed from the source topic is a defect, not at-least-once at work.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import ConsumerGroupState
from confluent_kafka.admin import AdminClient
from support.commit_crash import crash_mid_commit
from support.core_helpers import add_to_total, expected_totals, make_orders, orders_topic, totals_app, totals_in_store
from support.kafka_helpers import produce, wait_for

from dagster_stateful.core import App, State, Store
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.kafka.group_offsets import commit_group_offsets
from dagster_stateful.core.monitoring.report import WorkerReport
from dagster_stateful.core.state.commit_metadata import decode_commit_metadata
from dagster_stateful.errors import MetadataVersionError
from dagster_stateful.state_table import bootstrap_store

FIRST, SECOND = make_orders(300, customers=10), make_orders(300, customers=100, start=300)
"""The crashed commit's messages have ten times as many customers: a commit of 20 or 50 of them
touches few of its keys, so that its records of the others stay the latest of their keys."""


def crashed_after_delivery(bootstrap: str, tmp_path: Path, source: str, name: str, **settings: Any) -> App:
    """The app after one committed run over `FIRST`, and a worker over `SECOND` killed between
    delivering its changelog records and committing its offset (at-least-once)."""
    app = totals_app(bootstrap, source, tmp_path, name)
    assert app.run_worker(max_seconds=120).committed_offsets == {0: len(FIRST)}
    produce(bootstrap, source, SECOND)
    crash_mid_commit(tmp_path, bootstrap=bootstrap, source=source, state_dir=str(tmp_path), name=name)
    return totals_app(bootstrap, source, tmp_path, name, **settings)


def wait_until_empty(bootstrap: str, group: str) -> None:
    """Wait until the killed worker's session expired: a group with members refuses these tools."""
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def empty() -> bool:
        [description] = admin.describe_consumer_groups([group]).values()
        return description.result(30).state in (ConsumerGroupState.EMPTY, ConsumerGroupState.DEAD)

    wait_for(empty, 60, f"group {group} to have no member")


def reset_offsets(bootstrap: str, app: App, offset: int) -> None:
    """What `kafka-consumer-groups --reset-offsets --to-offset` (or `--to-current`) does: the offset
    committed with empty metadata."""
    wait_until_empty(bootstrap, app.consumer_group)
    commit_group_offsets(
        KafkaClients({"bootstrap.servers": bootstrap}), app.consumer_group, app.config.source, {0: offset}
    )


def assert_exact(app: App, report: WorkerReport, orders: list[tuple[bytes, bytes]]) -> None:
    totals, expected = totals_in_store(app, 1), expected_totals(orders)
    doubled = {
        customer: (totals.get(customer), total) for customer, total in expected.items() if totals.get(customer) != total
    }
    assert not doubled, f"customers whose totals differ from the source's (restored, expected): {doubled}"
    assert sum(restore.records_uncommitted_applied for restore in report.restores) == 0


@pytest.mark.parametrize("where", ["new-machine", "same-machine"])
def test_a_crashed_commit_stays_uncommitted_after_the_offsets_are_reset_to_current(
    kafka_bootstrap, unique_name, tmp_path, where
):
    """`--reset-offsets --to-current` leaves the offset and drops the metadata that recorded where the
    committed part of the changelog ended."""
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 1, FIRST)
    app = crashed_after_delivery(kafka_bootstrap, tmp_path, source, unique_name("totals"))
    reset_offsets(kafka_bootstrap, app, len(FIRST))
    if where == "new-machine":
        app.clear_state()

    report = app.run_worker(max_seconds=120)

    assert_exact(app, report, FIRST + SECOND)
    skipped = sum(restore.records_skipped for restore in report.restores)
    assert skipped == len(expected_totals(SECOND)), "the crashed commit's record of each customer is left out"


def test_offsets_reset_to_an_earlier_commit_rewind_the_restored_state(kafka_bootstrap, unique_name, tmp_path):
    """No crash: the group is moved back to where an earlier run committed, and the state restored on
    a new machine is the state of that moment, so that the messages since count once."""
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 1, FIRST)
    app = totals_app(kafka_bootstrap, source, tmp_path, unique_name("totals"))
    assert app.run_worker(max_seconds=120).committed_offsets == {0: len(FIRST)}
    produce(kafka_bootstrap, source, SECOND)
    assert app.run_worker(max_seconds=120).committed_offsets == {0: len(FIRST + SECOND)}
    reset_offsets(kafka_bootstrap, app, len(FIRST))
    app.clear_state()

    report = app.run_worker(max_seconds=120)

    assert_exact(app, report, FIRST + SECOND)


def test_a_crashed_commit_stays_uncommitted_when_the_group_offsets_expired(kafka_bootstrap, unique_name, tmp_path):
    """The group's offsets expired (deleted here): the worker resumes where its local state was
    committed (missing_offsets="resume-from-state"), with no metadata at all."""
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 1, FIRST)
    app = crashed_after_delivery(kafka_bootstrap, tmp_path, source, unique_name("totals"))
    wait_until_empty(kafka_bootstrap, app.consumer_group)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.delete_consumer_groups([app.consumer_group])[app.consumer_group].result(30)

    report = app.run_worker(max_seconds=120)

    assert_exact(app, report, FIRST + SECOND)


@pytest.mark.parametrize("reset", [False, True], ids=["metadata-kept", "offsets-reset"])
def test_a_crashed_commit_stays_uncommitted_through_commits_of_part_of_its_messages(
    kafka_bootstrap, unique_name, tmp_path, reset
):
    """The next owner commits before it passes the crashed commit's messages, in two bounded runs that
    reopen the store; then (with the group's metadata dropped or not) a new machine restores."""
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 1, FIRST)
    app = crashed_after_delivery(kafka_bootstrap, tmp_path, source, unique_name("totals"))
    for run in (1, 2):
        committed = app.run_worker(max_messages=20, max_seconds=120).committed_offsets
        assert committed == {0: len(FIRST) + 20 * run}
    if reset:
        reset_offsets(kafka_bootstrap, app, len(FIRST) + 40)
    app.clear_state()

    report = app.run_worker(max_seconds=120)

    assert_exact(app, report, FIRST + SECOND)


def test_switching_to_exactly_once_after_a_crash_is_exact(kafka_bootstrap, unique_name, tmp_path):
    """Exactly-once commits record no changelog ends: its first commit, before it passed the crashed
    at-least-once commit's messages, must not make that commit's records count."""
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 1, FIRST)
    name = unique_name("totals")
    app = crashed_after_delivery(
        kafka_bootstrap, tmp_path, source, name, processing_guarantee="exactly-once", commit_every=50
    )
    assert app.run_worker(max_messages=50, max_seconds=120).committed_offsets == {0: len(FIRST) + 50}
    app.clear_state()

    report = app.run_worker(max_seconds=120)

    assert report.processing_guarantee == "exactly-once"
    assert_exact(app, report, FIRST + SECOND)


def test_metadata_of_a_later_release_is_refused_before_anything_is_processed(kafka_bootstrap, unique_name, tmp_path):
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 1, FIRST)
    app = totals_app(kafka_bootstrap, source, tmp_path, unique_name("totals"))
    later = 'ds2:{"v": 4, "o": 0, "t": {}, "c": {"totals": 0}, "h": 1}'
    kafka = KafkaClients({"bootstrap.servers": kafka_bootstrap})
    commit_group_offsets(kafka, app.consumer_group, source, {0: 0}, {0: later})

    with pytest.raises(MetadataVersionError, match=rf"{source}\[0\].*later release"):
        app.run_worker(max_seconds=60)

    assert kafka.committed(app.consumer_group, source, [0]) == {0: (0, later)}, "nothing was committed"
    assert totals_in_store(app, 1) == {}


def note_last_order(order: dict, state: State) -> None:
    state.set("last", order["amount"])


def test_a_bootstrap_of_one_store_keeps_the_other_stores_stream_times(kafka_bootstrap, unique_name, tmp_path):
    """The bootstrap commits the group's offsets from outside the workers: the stream time of the
    app's store whose entries expire must survive it, or expired entries would come back."""
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 1, FIRST)
    app = App(
        name=unique_name("two-stores"),
        source=source,
        stores=[Store("recent", ttl=timedelta(days=30)), "totals"],
        state_dir=tmp_path / "state",
        snapshot_root=str(tmp_path / "snapshots"),
        kafka=kafka_bootstrap,
        commit_interval=0.5,
    )
    app.dataframe().update(note_last_order, stateful=True, store="recent").apply(
        add_to_total, stateful=True, store="totals"
    )
    assert app.run_worker(max_seconds=120).committed_offsets == {0: len(FIRST)}
    kafka = KafkaClients({"bootstrap.servers": kafka_bootstrap})
    [(offset, metadata)] = kafka.committed(app.consumer_group, source, [0]).values()
    before = decode_commit_metadata(metadata, offset, source)
    assert set(before.stream_times) == {"recent"}
    wait_until_empty(kafka_bootstrap, app.consumer_group)

    table = pa.table({"key": ["c0"], "state_key": ["total"], "value": [1_000]})
    bootstrap_store(app, "totals", table, {0: len(FIRST)}, replace=True)

    [(offset, metadata)] = kafka.committed(app.consumer_group, source, [0]).values()
    after = decode_commit_metadata(metadata, offset, source)
    assert offset == len(FIRST) and after.stream_times == before.stream_times
    assert after.changelog_ends == {k: v for k, v in before.changelog_ends.items() if k != "totals"}
