"""A restore takes the records below the changelog end the group's last commit recorded without
reading their headers, and learns what it may vouch for in its own commits (real broker).

The records below that end are all of committed messages (`processing.changelog_positions` records
it only then), so a restore that skips their headers must build the very state the header rule
builds, tombstones and all, in a full restore and on top of existing state. What a finished restore
knows (`ChangelogPrefix`) decides whether the worker's commits may record an end: only when the
store's own state lies below the recorded end, and only once its commits pass every uncommitted
record the restore read.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

from confluent_kafka import Producer
from support.kafka_helpers import create_topic

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.clients import RESTORE_CONSUMER_CONFIG, KafkaClients
from dagster_stateful.core.kafka.records import Headers
from dagster_stateful.core.monitoring.listeners import Listeners
from dagster_stateful.core.recovery.changelog_format import STATE_WRITE_HEADERS, source_offset_header
from dagster_stateful.core.recovery.restorer import Restorer
from dagster_stateful.core.state.changelog_prefix import ChangelogPrefix
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.partition import StorePartition

KEYS = 40
RECORDS = 600
COMMITTED = 10_000
"""The group's committed source offset: every record written below is of a committed message."""


def write(bootstrap: str, topic: str, count: int, first_processed: int, seed: int) -> None:
    """`count` puts and tombstones over a few keys, processed from source offset `first_processed` on."""
    chooser = random.Random(seed)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for n in range(count):
        key = f"k{chooser.randrange(KEYS):03d}".encode()
        value = None if chooser.random() < 0.2 else f"v{seed}-{n}".encode()
        producer.produce(topic, key=key, value=value, partition=0, headers=source_offset_header(first_processed + n))
    producer.flush(30)


def write_without_offsets(
    bootstrap: str, topic: str, count: int, seed: int, headers: Headers | None = None
) -> dict[bytes, bytes | None]:
    """`count` puts and tombstones without the source-offset header (`headers`: none, or others);
    returns each key's last value."""
    chooser = random.Random(seed)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    last: dict[bytes, bytes | None] = {}
    for n in range(count):
        key = f"k{chooser.randrange(KEYS):03d}".encode()
        value = None if chooser.random() < 0.2 else f"v{seed}-{n}".encode()
        producer.produce(topic, key=key, value=value, partition=0, headers=headers)
        last[key] = value
    producer.flush(30)
    return last


def live(values: dict[bytes, bytes | None]) -> dict[bytes, bytes]:
    return {key: value for key, value in values.items() if value is not None}


def store_at(root: Path, name: str) -> StorePartition:
    config = AppConfig(name=name, source=f"{name}-source", stores=("totals",))
    store = StateDirectory(root, config).partition("totals", 0)
    store.open()
    return store


def restorer_for(bootstrap: str, group: str) -> Restorer:
    kafka = KafkaClients({"bootstrap.servers": bootstrap})
    return Restorer(kafka, kafka.consumer({"group.id": group, **RESTORE_CONSUMER_CONFIG}), Listeners(), batch_size=50)


def test_records_below_the_committed_end_restore_to_the_state_their_headers_give(
    kafka_bootstrap, unique_name, tmp_path
):
    name = unique_name("end")
    with_end, with_headers = store_at(tmp_path / "a", name), store_at(tmp_path / "b", name)
    create_topic(kafka_bootstrap, with_end.changelog_topic, 1, {"cleanup.policy": "compact"})
    write(kafka_bootstrap, with_end.changelog_topic, RECORDS, 0, seed=1)
    restorer = restorer_for(kafka_bootstrap, f"{name}-restore")

    fast = restorer.restore(with_end, COMMITTED, committed_end=RECORDS)
    read = restorer.restore(with_headers, COMMITTED)

    assert fast is not None and read is not None and fast.kind == read.kind == "full"
    assert fast.records_below_committed_end == RECORDS and read.records_below_committed_end == 0
    assert dict(with_end.items()) == dict(with_headers.items()) and dict(with_end.items())
    assert with_end.changelog_offset == with_headers.changelog_offset == RECORDS

    write(kafka_bootstrap, with_end.changelog_topic, RECORDS, RECORDS, seed=2)
    fast = restorer.restore(with_end, COMMITTED, committed_end=2 * RECORDS - 100)
    read = restorer.restore(with_headers, COMMITTED)

    assert fast is not None and read is not None and fast.kind == read.kind == "partial"
    assert 0 < fast.records_below_committed_end < RECORDS, "on top of state: up to the end, and headers after it"
    assert dict(with_end.items()) == dict(with_headers.items())


def test_a_restore_knows_the_changelog_below_its_end_only_from_a_base_the_last_commit_vouched_for(
    kafka_bootstrap, unique_name, tmp_path
):
    name = unique_name("prefix")
    store = store_at(tmp_path, name)
    create_topic(kafka_bootstrap, store.changelog_topic, 1, {"cleanup.policy": "compact"})
    write(kafka_bootstrap, store.changelog_topic, RECORDS, 0, seed=3)
    restorer = restorer_for(kafka_bootstrap, f"{name}-restore")

    assert restorer.restore(store, COMMITTED) is not None
    assert store.changelog_prefix == ChangelogPrefix(RECORDS, COMMITTED), "a full restore read everything"

    write(kafka_bootstrap, store.changelog_topic, 10, RECORDS, seed=4)
    assert restorer.restore(store, COMMITTED, committed_end=RECORDS) is not None
    assert store.changelog_prefix == ChangelogPrefix(RECORDS + 10, COMMITTED), "its state lay below the end"

    write(kafka_bootstrap, store.changelog_topic, 10, RECORDS + 10, seed=5)
    assert restorer.restore(store, COMMITTED, committed_end=RECORDS) is not None
    assert store.changelog_prefix is None, "its state came from records past the end: nothing vouches for them"

    write(kafka_bootstrap, store.changelog_topic, 10, RECORDS + 20, seed=6)
    assert restorer.restore(store, COMMITTED) is not None
    assert store.changelog_prefix is None, "a partial restore without an end knows nothing below its start"

    assert restorer.begin(store, COMMITTED, committed_end=RECORDS + 30) is None, "up to date"
    assert store.changelog_prefix == ChangelogPrefix(RECORDS + 30, COMMITTED)


def test_a_restore_that_read_uncommitted_records_vouches_only_past_them(kafka_bootstrap, unique_name, tmp_path):
    name = unique_name("leftovers")
    store = store_at(tmp_path, name)
    create_topic(kafka_bootstrap, store.changelog_topic, 1, {"cleanup.policy": "compact"})
    write(kafka_bootstrap, store.changelog_topic, 100, 0, seed=7)
    write(kafka_bootstrap, store.changelog_topic, 30, 100, seed=8)  # a crashed commit's, processed 100..129

    report = restorer_for(kafka_bootstrap, f"{name}-restore").restore(store, 100)

    assert report is not None and report.uncommitted_processed_up_to == 129
    assert store.changelog_prefix == ChangelogPrefix(130, 130), "commits at 130 or later may vouch for them"


def test_a_committed_end_past_the_changelog_is_ignored_with_a_warning(kafka_bootstrap, unique_name, tmp_path, caplog):
    name = unique_name("recreated")
    store = store_at(tmp_path, name)
    create_topic(kafka_bootstrap, store.changelog_topic, 1, {"cleanup.policy": "compact"})
    write(kafka_bootstrap, store.changelog_topic, 50, 0, seed=9)

    with caplog.at_level(logging.WARNING):
        report = restorer_for(kafka_bootstrap, f"{name}-restore").restore(store, COMMITTED, committed_end=5_000)

    assert report is not None and report.records_below_committed_end == 0
    assert "past the end (50)" in caplog.text and store.changelog_topic in caplog.text
    assert store.changelog_prefix == ChangelogPrefix(50, COMMITTED), "it read every header itself"


def test_records_without_headers_past_the_recorded_end_are_uncommitted_only_where_the_last_commit_says_so(
    kafka_bootstrap, unique_name, tmp_path
):
    """Records without headers outside any block, as the release before blocks wrote them only in
    commits that record their end: past the end
    the group's last commit recorded, such records are of a commit whose offset was never committed.
    Metadata of an older engine (no "h") leaves them committed; state written from outside the
    workers carries its own header and counts as committed wherever it lies."""
    name = unique_name("bare")
    topic = store_at(tmp_path / "topic", name).changelog_topic
    create_topic(kafka_bootstrap, topic, 1, {"cleanup.policy": "compact"})
    committed = write_without_offsets(kafka_bootstrap, topic, 100, seed=10)
    crashed = write_without_offsets(kafka_bootstrap, topic, 30, seed=11)
    restorer = restorer_for(kafka_bootstrap, f"{name}-restore")

    store = store_at(tmp_path / "flagged", name)
    report = restorer.restore(store, COMMITTED, committed_end=100, bare_uncommitted=True)
    assert report is not None and report.records_below_committed_end == 100
    assert dict(store.items()) == live(committed), "the crashed commit's records are left out"
    assert report.bare_uncommitted_read and report.records_skipped == 30
    assert store.changelog_offset == 100, "the next restore reads them again"
    assert store.changelog_prefix == ChangelogPrefix(130, None), "vouches once the source end is known"

    older = store_at(tmp_path / "older", name)
    assert restorer.restore(older, COMMITTED, committed_end=100) is not None
    assert dict(older.items()) == live(committed | crashed), "an older engine's metadata: all committed"

    never = store_at(tmp_path / "never", name)
    assert restorer.restore(never, None) is not None
    assert dict(never.items()) == {}, "nothing was ever committed: processing starts over"

    state = write_without_offsets(kafka_bootstrap, topic, 20, seed=12, headers=STATE_WRITE_HEADERS)
    written = store_at(tmp_path / "written", name)
    assert restorer.restore(written, COMMITTED, committed_end=100, bare_uncommitted=True) is not None
    assert dict(written.items()) == live(committed | state), "state written from outside counts past the end too"
