"""Full changelog restores of several partitions in parallel processes: each partition ends with the
changelog's latest value per key (overwrites and deletes across chunks included), the restore run
takes that path for partitions without local state and gives the totals a replay gives, and a child
that fails names its partitions and leaves every store as it was."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest
from confluent_kafka import Producer
from support.core_helpers import expected_totals, make_orders, orders_topic, totals_app, totals_in_store
from support.kafka_helpers import create_topic

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import KafkaClients
from dagster_stateful.core.recovery.changelog_format import source_offset_header
from dagster_stateful.core.recovery.parallel_replay import SstFilesTarget, replay_directory, replay_partitions
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.errors import RecoveryError

KEYS = 50
ALL_COMMITTED = 10**9
RECORDS = {0: 900, 1: 600, 2: 300}
"""Changelog records per partition: unequal, so that the groups are balanced by records."""


def write_changelog(bootstrap: str, topic: str) -> dict[int, dict[bytes, bytes]]:
    """Puts and tombstones on a few keys per partition; returns each partition's latest values."""
    chooser = random.Random(11)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    latest: dict[int, dict[bytes, bytes | None]] = {partition: {} for partition in RECORDS}
    for partition, records in RECORDS.items():
        for offset in range(records):
            key = f"p{partition}-k{chooser.randrange(KEYS):03d}".encode()
            value = None if chooser.random() < 0.2 else f"v{offset}".encode()
            producer.produce(topic, key=key, value=value, partition=partition, headers=source_offset_header(offset))
            latest[partition][key] = value
    producer.flush(30)
    return {p: {k: v for k, v in values.items() if v is not None} for p, values in latest.items()}


def open_stores(root: Path, name: str) -> dict[int, StorePartition]:
    state = StateDirectory(root, AppConfig(name=name, source=f"{name}-source", stores=("totals",)))
    stores = {partition: state.partition("totals", partition) for partition in RECORDS}
    for store in stores.values():
        store.open()
    return stores


def test_partitions_replayed_in_two_processes_hold_the_latest_value_of_every_key(
    kafka_bootstrap, unique_name, tmp_path
):
    name = unique_name("replay")
    stores = open_stores(tmp_path, name)
    topic = stores[0].changelog_topic
    create_topic(kafka_bootstrap, topic, len(RECORDS), {"cleanup.policy": "compact"})
    expected = write_changelog(kafka_bootstrap, topic)
    kafka = KafkaClients({"bootstrap.servers": kafka_bootstrap})
    marks = kafka.watermarks(topic, RECORDS, committed=True)
    try:
        reports = replay_partitions(
            kafka, f"{name}-restore", stores, dict.fromkeys(RECORDS, ALL_COMMITTED), marks, 2, 40, chunk_records=25
        )

        for partition, store in stores.items():
            assert dict(store.items()) == expected[partition], f"partition {partition}"
            assert store.changelog_offset == RECORDS[partition] and store.source_offset == ALL_COMMITTED
            assert reports[partition].kind == "full" and reports[partition].end_offset == RECORDS[partition]
            assert not replay_directory(store).exists(), "the SST files were moved in or removed"
    finally:
        for store in stores.values():
            store.close()


def test_a_child_that_fails_names_its_partitions_and_nothing_is_ingested(kafka_bootstrap, unique_name, tmp_path):
    name = unique_name("replay-fails")
    stores = open_stores(tmp_path, name)
    topic = stores[0].changelog_topic
    create_topic(kafka_bootstrap, topic, len(RECORDS), {"cleanup.policy": "compact"})
    write_changelog(kafka_bootstrap, topic)
    kafka = KafkaClients({"bootstrap.servers": kafka_bootstrap})
    marks = kafka.watermarks(topic, RECORDS, committed=True)
    # The smallest partition goes to the child (the largest stays here): its SST directory cannot be made.
    replay_directory(stores[2]).write_text("in the way")
    try:
        with pytest.raises(RecoveryError) as raised:
            replay_partitions(kafka, f"{name}-restore", stores, dict.fromkeys(RECORDS, ALL_COMMITTED), marks, 2, 40)

        assert f"{topic}[2]" in str(raised.value) and "child process" in str(raised.value)
        assert "Nothing was ingested" in str(raised.value)
        for store in stores.values():
            assert store.changelog_offset is None and list(store.items()) == [], "no store took anything"
    finally:
        for store in stores.values():
            store.close()


def test_a_restore_run_replays_partitions_without_local_state_in_parallel_to_the_same_totals(
    kafka_bootstrap, unique_name, tmp_path, caplog
):
    orders = make_orders(3_000, customers=90)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 4, orders)
    app = totals_app(kafka_bootstrap, source, tmp_path / "owner", unique_name("totals"), commit_every=100)
    assert app.run_worker(max_seconds=120).stop_reason == "caught_up"
    parallel, sequential = app.bind(state_dir=tmp_path / "parallel"), app.bind(state_dir=tmp_path / "sequential")

    with caplog.at_level(logging.INFO, logger="dagster_stateful.core.recovery.parallel_replay"):
        in_parallel = parallel.restore_partitions(range(4), load_processes=2)
    one_by_one = sequential.restore_partitions(range(4), load_processes=1)

    assert "in 2 process(es)" in caplog.text, "the four partitions were replayed by two processes"
    assert totals_in_store(parallel, 4) == totals_in_store(sequential, 4) == expected_totals(orders)
    for restored in (in_parallel, one_by_one):
        assert [report.kind for result in restored for report in result.reports] == ["full"] * 4


def test_a_replaying_process_knows_which_keys_its_chunks_hold(tmp_path):
    """The at-least-once rule asks a full restore whether it restored a key already (`holds`): after
    each chunk, exactly the keys put and not deleted since."""
    target = SstFilesTarget("totals", 0, "app-totals-changelog", tmp_path / "replay")
    target.ingest_restored([(b"a", b"1"), (b"b", b"2"), (b"c", None)], 3)
    assert [target.holds(key) for key in (b"a", b"b", b"c")] == [True, True, False]

    target.ingest_restored([(b"a", None), (b"c", b"3"), (b"d", b"4")], 6)

    assert [target.holds(key) for key in (b"a", b"b", b"c", b"d")] == [False, True, True, True]
    assert target.position == 6 and len(target.chunks) == 2
