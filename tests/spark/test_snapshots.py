"""Compaction snapshots built by Spark from a real changelog, and local bulk restores from them.

Snapshots hold only what the consumer group committed: a changelog whose last records come from
messages whose commit never finished is cut at the first such record, and a snapshot load plus the
ordinary tail replay gives what a plain changelog replay gives.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from support.core_helpers import store_content
from support.kafka_helpers import create_topic, produce, read_keyed

from dagster_stateful.core import App, State
from dagster_stateful.core.kafka.records import Headers
from dagster_stateful.core.recovery.changelog_format import STATE_WRITE_HEADERS, block_headers, source_offset_header
from dagster_stateful.core.recovery.parallel_load import load_snapshot_partitions
from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest, SnapshotStore
from dagster_stateful.core.recovery.snapshot_image import fetch_image
from dagster_stateful.core.recovery.verification import partition_digest
from dagster_stateful.core.state.commit_metadata import encode_commit_metadata
from dagster_stateful.core.state.keys import message_prefix
from dagster_stateful.core.state.rocksdb import PartitionDatabase
from dagster_stateful.spark.snapshots import build_snapshot, snapshot_changelog

pytestmark = pytest.mark.spark
PARTITIONS = 2


def upsert_or_delete(event: dict, state: State) -> None:
    if event.get("delete"):
        state.delete("profile")
    else:
        state.set("profile", event)


def events(start: int, count: int, users: int, delete_every: int = 0) -> list[tuple[bytes, bytes]]:
    return [
        (
            f"user-{i % users}".encode(),
            orjson.dumps({"delete": True} if delete_every and i % delete_every == 0 else {"seen": i}),
        )
        for i in range(start, start + count)
    ]


def profiles_app(bootstrap: str, source: str, state_dir, name: str) -> App:
    app = App(
        name=name,
        source=source,
        stores=["profiles"],
        state_dir=state_dir,
        kafka=bootstrap,
        commit_every=37,
        commit_interval=0.5,
    )  # small commits: many versions of each key in the changelog
    app.dataframe().update(upsert_or_delete, stateful=True)
    return app


@pytest.fixture
def profiles(kafka_bootstrap, unique_name, tmp_path):
    source = unique_name("profiles")
    create_topic(kafka_bootstrap, source, partitions=PARTITIONS)
    produce(kafka_bootstrap, source, events(0, 600, users=90, delete_every=7))
    app = profiles_app(kafka_bootstrap, source, tmp_path / "state", unique_name("profiles"))
    app.run_worker(max_seconds=120)
    return app


def changelog_ends(app: App) -> dict[int, int]:
    return {
        p: high for p, (_, high) in app.kafka.watermarks(app.changelog_topic("profiles"), range(PARTITIONS)).items()
    }


def committed(app: App, partitions: int = PARTITIONS) -> dict[int, int | None]:
    return app.kafka.committed_offsets(app.consumer_group, app.source, range(partitions))


def snapshot_profiles(
    spark: Any, bootstrap: str, app: App, snapshots: SnapshotStore, sst_image: bool = True
) -> SnapshotManifest:
    """A snapshot of the profiles app's whole changelog, as the snapshot job takes it."""
    topic = app.changelog_topic("profiles")
    return build_snapshot(
        spark,
        {"kafka.bootstrap.servers": bootstrap},
        topic,
        changelog_ends(app),
        committed(app),
        snapshots,
        sst_image=sst_image,
    )


def snapshot_rows(
    snapshots: SnapshotStore, snapshot_id: str, partitions: int = PARTITIONS
) -> dict[tuple[int, bytes], bytes]:
    rows = {}
    for partition in range(partitions):
        previous = None
        for keys, values in snapshots.read_partition(snapshot_id, partition):
            for key, value in zip(keys, values, strict=False):
                assert previous is None or key > previous, "rows are sorted by the raw key bytes"
                rows[(partition, key)] = value
                previous = key
    return rows


def live_changelog(bootstrap: str, app: App) -> dict[bytes, bytes]:
    latest: dict[bytes, bytes | None] = {}
    for key, value in read_keyed(bootstrap, app.changelog_topic("profiles")):
        latest[key] = value
    return {key: value for key, value in latest.items() if value is not None}


def test_snapshot_holds_the_latest_live_value_of_every_key(spark, kafka_bootstrap, profiles, tmp_path):
    snapshots = SnapshotStore(str(tmp_path / "snapshots"), profiles.name, "profiles")
    ends = changelog_ends(profiles)

    manifest = build_snapshot(
        spark,
        {"kafka.bootstrap.servers": kafka_bootstrap},
        profiles.changelog_topic("profiles"),
        ends,
        committed(profiles),
        snapshots,
    )

    rows = snapshot_rows(snapshots, manifest.snapshot_id)
    assert {key: value for (_, key), value in rows.items()} == live_changelog(kafka_bootstrap, profiles)
    assert manifest.end_offsets == ends
    assert manifest.key_counts == {p: sum(1 for (q, _) in rows if q == p) for p in range(PARTITIONS)}
    assert snapshots.latest() == manifest
    assert image_rows(snapshots, manifest, tmp_path / "image") == rows, "the SST image holds the same rows"


def test_a_snapshot_whose_image_cannot_be_written_is_published_without_it(
    spark, kafka_bootstrap, profiles, tmp_path, monkeypatch, caplog
):
    def executors_without_rocksdict(*_: object) -> None:
        raise RuntimeError("PythonException: ModuleNotFoundError: No module named 'rocksdict'")

    monkeypatch.setattr("dagster_stateful.spark.snapshots.write_sst_files", executors_without_rocksdict)
    snapshots = SnapshotStore(str(tmp_path / "snapshots"), profiles.name, "profiles")

    with caplog.at_level(logging.WARNING, logger="dagster_stateful.spark.snapshots"):
        manifest = snapshot_profiles(spark, kafka_bootstrap, profiles, snapshots)

    assert manifest.sst_image == {} and snapshots.latest() == manifest
    assert {key: value for (_, key), value in snapshot_rows(snapshots, manifest.snapshot_id).items()} == (
        live_changelog(kafka_bootstrap, profiles)
    )
    assert any("published without it" in m and "rocksdict" in m for m in caplog.messages), caplog.messages


def test_a_snapshot_of_an_empty_changelog_has_an_empty_image(spark, kafka_bootstrap, unique_name, tmp_path):
    topic = unique_name("empty-changelog")
    create_topic(kafka_bootstrap, topic, partitions=PARTITIONS)
    snapshots = SnapshotStore(str(tmp_path / "snapshots"), "app", "profiles")
    ends = dict.fromkeys(range(PARTITIONS), 0)

    manifest = build_snapshot(spark, {"kafka.bootstrap.servers": kafka_bootstrap}, topic, ends, {}, snapshots)

    assert manifest.key_counts == dict.fromkeys(range(PARTITIONS), 0)
    assert manifest.sst_image == {p: [] for p in range(PARTITIONS)}


def image_rows(snapshots: SnapshotStore, manifest: SnapshotManifest, work: Path) -> dict[tuple[int, bytes], bytes]:
    """Every partition's SST image, ingested into a fresh database, read back."""
    rows: dict[tuple[int, bytes], bytes] = {}
    for partition in range(PARTITIONS):
        assert manifest.sst_image[partition], f"partition {partition} has SST files"
        database = PartitionDatabase(work / f"db-{partition}")
        try:
            database.ingest_files(fetch_image(snapshots, manifest, partition, work / f"scratch-{partition}"))
            rows |= {(partition, key): value for key, value in database.items()}
        finally:
            database.close()
    return rows


def test_incremental_snapshots_equal_a_full_one(spark, kafka_bootstrap, profiles, tmp_path):
    kafka = {"kafka.bootstrap.servers": kafka_bootstrap}
    incremental = SnapshotStore(str(tmp_path / "incremental"), profiles.name, "profiles")
    topic = profiles.changelog_topic("profiles")
    first = build_snapshot(spark, kafka, topic, changelog_ends(profiles), committed(profiles), incremental)
    produce(kafka_bootstrap, profiles.source, events(600, 300, users=120, delete_every=5))
    profiles.run_worker(max_seconds=120)
    ends = changelog_ends(profiles)

    second = build_snapshot(spark, kafka, topic, ends, committed(profiles), incremental, keep=1)
    full = SnapshotStore(str(tmp_path / "full"), profiles.name, "profiles")
    from_scratch = build_snapshot(spark, kafka, topic, ends, committed(profiles), full)

    assert second.previous == first.snapshot_id
    assert snapshot_rows(incremental, second.snapshot_id) == snapshot_rows(full, from_scratch.snapshot_id)
    assert [m.snapshot_id for m in incremental.manifests()] == [second.snapshot_id], "older snapshots pruned"


@pytest.mark.parametrize("sst_image", [True, False], ids=["sst-image", "parquet"])
def test_local_snapshot_restore_equals_a_replay_and_the_worker_continues(
    spark, kafka_bootstrap, profiles, tmp_path, sst_image
):
    snapshots = SnapshotStore(str(tmp_path / "snapshots"), profiles.name, "profiles")
    manifest = snapshot_profiles(spark, kafka_bootstrap, profiles, snapshots, sst_image=sst_image)
    assert bool(manifest.sst_image) is sst_image
    produce(kafka_bootstrap, profiles.source, events(600, 200, users=90, delete_every=3))
    profiles.run_worker(max_seconds=120)  # the changelog moves past the snapshot: a tail to replay
    restored = profiles.bind(state_dir=tmp_path / "restored")

    stores = {partition: restored.state.partition("profiles", partition) for partition in range(PARTITIONS)}
    for store in stores.values():
        store.open()
    try:  # two processes write the partitions' SST files
        reports = load_snapshot_partitions(stores, snapshots, manifest, changelog_ends(profiles), processes=2)
        for partition, store in stores.items():
            report = reports[partition]
            assert report.kind == "snapshot" and report.records_applied == manifest.key_counts[partition]
            assert store.changelog_offset == manifest.end_offsets[partition]
    finally:
        for store in stores.values():
            store.close()
    report = restored.run_worker(max_seconds=120)  # ordinary recovery replays only the tail

    assert {r.kind for r in report.restores} == {"partial"}
    assert all(r.start_offset == manifest.end_offsets[r.partition] for r in report.restores)
    for partition in range(PARTITIONS):
        store = restored.state.partition("profiles", partition)
        store.open()
        try:
            assert partition_digest(store) == restored.replay_digest("profiles", partition)
        finally:
            store.close()
    produce(kafka_bootstrap, profiles.source, [(b"user-1", orjson.dumps({"seen": "after restore"}))])
    assert restored.run_worker(max_seconds=120).total_processed == 1
    content = store_content(restored, "profiles", PARTITIONS)
    assert orjson.loads(content[(b"user-1", b"profile")]) == {"seen": "after restore"}


# Snapshots hold only what was committed (issue defect 9): a changelog cut during a commit that never finished.

CUT_PARTITIONS = 4
FAR_OFFSET = 1000  # a committed offset past every processed offset below


@dataclass(frozen=True)
class ChangelogRecord:
    partition: int
    user: str
    processed: int | None
    """The processed source offset in the `source_offset` header; None: state written from outside the
    workers (the `state_write` header: committed wherever it lies)."""
    value: str | None
    """None: a tombstone. Values of uncommitted messages start with "in-flight"."""
    extra_headers: tuple[tuple[str, bytes], ...] = ()


def scoped(user: str) -> bytes:
    return message_prefix(user.encode()) + b"profile"


def encoded(value: str | None) -> bytes | None:
    return None if value is None else orjson.dumps({"seen": value})


COMMITTED: dict[int, int | None] = {0: 10, 1: 8, 2: None, 3: 20}
"""The group's committed source offsets while the snapshot is built; partition 2 never committed."""
CHANGELOG = [
    # partition 0: committed records, then the tail of a commit that never finished (the last records)
    ChangelogRecord(0, "a", 0, "a1"),
    ChangelogRecord(0, "b", 1, "b1"),
    ChangelogRecord(0, "a", 2, "a2"),
    ChangelogRecord(0, "c", 3, "c1"),
    ChangelogRecord(0, "c", 4, None),
    ChangelogRecord(0, "d", 5, "d1"),
    ChangelogRecord(0, "b", 9, "b2"),
    # the processed offset is the second header: the first one must not be read as an offset
    ChangelogRecord(0, "a", 10, "in-flight a", extra_headers=(("trace", b"\xff" * 8),)),
    ChangelogRecord(0, "e", 11, "in-flight e"),
    ChangelogRecord(0, "d", 11, None),  # an uncommitted delete
    # partition 1: an uncommitted record (at the committed offset itself) followed by committed ones
    ChangelogRecord(1, "f", 0, "f1"),
    ChangelogRecord(1, "g", None, "g1"),
    ChangelogRecord(1, "h", 3, "h1"),
    ChangelogRecord(1, "f", 8, "in-flight f"),
    ChangelogRecord(1, "h", 5, "h2"),
    ChangelogRecord(1, "i", 7, "i1"),
    # partition 2: the group never committed, so every record with the header is uncommitted
    ChangelogRecord(2, "j", 0, "in-flight j"),
    ChangelogRecord(2, "k", 1, "in-flight k"),
    ChangelogRecord(2, "l", None, "l1"),
    # partition 3: everything committed
    ChangelogRecord(3, "m", 0, "m1"),
    ChangelogRecord(3, "n", None, "n1"),
    ChangelogRecord(3, "m", 19, "m2"),
    ChangelogRecord(3, "o", 12, "o1", extra_headers=(("trace", b"x"),)),
]
FIRST_UNCOMMITTED = {0: 7, 1: 3, 2: 0}
"""Per partition, the changelog offset of the first record of an uncommitted message (see CHANGELOG)."""


def produce_changelog(bootstrap: str, topic: str, records: list[ChangelogRecord]) -> dict[int, int]:
    """Produce `records` in order (engine format); returns the changelog's end offset per partition."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    delivered: list[tuple[int, int]] = []
    errors: list[str] = []

    def on_delivery(error, message) -> None:
        if error is not None:
            errors.append(str(error))
        else:
            delivered.append((message.partition(), message.offset()))

    for record in records:
        header = source_offset_header(record.processed) if record.processed is not None else STATE_WRITE_HEADERS
        producer.produce(
            topic,
            key=scoped(record.user),
            value=encoded(record.value),
            partition=record.partition,
            headers=[*record.extra_headers, *header],
            on_delivery=on_delivery,
        )
    assert producer.flush(30) == 0 and not errors, errors
    ends = {p: sum(1 for r in records if r.partition == p) for p in range(CUT_PARTITIONS)}
    assert sorted(delivered) == sorted((p, o) for p, end in ends.items() for o in range(end)), "offsets 0, 1, ..."
    return ends


def commit_source_offsets(app: App, offsets: dict[int, int | None]) -> None:
    """Commit the group's source offsets, as a worker's commit would."""
    consumer = Consumer(
        {"bootstrap.servers": app.kafka.bootstrap_servers, "group.id": app.consumer_group, "enable.auto.commit": False}
    )
    try:
        consumer.commit(
            offsets=[TopicPartition(app.source, p, o) for p, o in offsets.items() if o is not None],
            asynchronous=False,
        )
    finally:
        consumer.close()
    assert committed(app, CUT_PARTITIONS) == offsets


@dataclass(frozen=True)
class InFlight:
    app: App
    ends: dict[int, int]


@pytest.fixture
def in_flight(kafka_bootstrap, unique_name, tmp_path) -> InFlight:
    """An app whose changelog holds records of messages whose commit never finished."""
    source = unique_name("visits")
    create_topic(kafka_bootstrap, source, partitions=CUT_PARTITIONS)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for partition in range(CUT_PARTITIONS):
        for n in range(20):
            producer.produce(source, key=b"u", value=orjson.dumps({"n": n}), partition=partition)
    assert producer.flush(30) == 0
    app = profiles_app(kafka_bootstrap, source, tmp_path / "state", unique_name("in-flight"))
    app.provision()
    ends = produce_changelog(kafka_bootstrap, app.changelog_topic("profiles"), CHANGELOG)
    commit_source_offsets(app, COMMITTED)
    return InFlight(app, ends)


def committed_content(records: list[ChangelogRecord], ends: dict[int, int]) -> dict[tuple[int, bytes], bytes]:
    """The live value per key of the records below `ends` (per partition), in changelog order."""
    latest: dict[tuple[int, bytes], bytes | None] = {}
    offsets = dict.fromkeys(range(CUT_PARTITIONS), 0)
    for record in records:
        if offsets[record.partition] < ends[record.partition]:
            latest[(record.partition, scoped(record.user))] = encoded(record.value)
        offsets[record.partition] += 1
    return {key: value for key, value in latest.items() if value is not None}


def newest_uncommitted(
    records: list[ChangelogRecord], committed_offsets: dict[int, int | None]
) -> dict[tuple[bytes, bytes], bytes | None]:
    """(message key, state key) -> the value of its newest record of an uncommitted message."""
    newest: dict[tuple[bytes, bytes], bytes | None] = {}
    for record in records:
        committed_offset = committed_offsets[record.partition]
        if record.processed is not None and (committed_offset is None or record.processed >= committed_offset):
            newest[(record.user.encode(), b"profile")] = encoded(record.value)
    return newest


def test_snapshot_stops_at_the_first_record_of_an_uncommitted_message(spark, kafka_bootstrap, in_flight, tmp_path):
    app, ends = in_flight.app, in_flight.ends
    snapshots = SnapshotStore(str(tmp_path / "snapshots"), app.name, "profiles")

    manifest = build_snapshot(
        spark,
        {"kafka.bootstrap.servers": kafka_bootstrap},
        app.changelog_topic("profiles"),
        ends,
        committed(app, CUT_PARTITIONS),
        snapshots,
    )

    cut = {p: FIRST_UNCOMMITTED.get(p, ends[p]) for p in range(CUT_PARTITIONS)}
    assert manifest.end_offsets == cut == {0: 7, 1: 3, 2: 0, 3: 4}
    assert manifest.extra["partitions_cut_short"] == 3
    rows = snapshot_rows(snapshots, manifest.snapshot_id, CUT_PARTITIONS)
    in_flight_values = {encoded(r.value) for r in CHANGELOG if r.value is not None and r.value.startswith("in-flight")}
    assert not in_flight_values & set(rows.values()), "no value of an uncommitted message is in the snapshot"
    assert rows[(0, scoped("d"))] == encoded("d1"), "an uncommitted delete is not applied"
    assert rows == committed_content(CHANGELOG, cut)
    assert manifest.key_counts == {0: 3, 1: 3, 2: 0, 3: 3}

    # Ordinary restore: load the snapshot, then replay the changelog tail after it (under the committed offsets).
    restored = app.bind(state_dir=tmp_path / "restored")
    results = restored.restore_partitions(range(CUT_PARTITIONS), snapshot_root=snapshots.root, method="snapshot")
    assert {r.partition: r.plan.path for r in results} == dict.fromkeys(range(CUT_PARTITIONS), "snapshot")
    tails = {r.partition: report for r in results for report in r.reports if report.kind != "snapshot"}
    assert {p: report.start_offset for p, report in tails.items()} == FIRST_UNCOMMITTED, "the tail starts at the cut"
    replayed = app.bind(state_dir=tmp_path / "replayed")
    replayed.restore_partitions(range(CUT_PARTITIONS), method="changelog")

    content = store_content(restored, "profiles", CUT_PARTITIONS)
    replay = store_content(replayed, "profiles", CUT_PARTITIONS)
    differing = {key for key in content.keys() | replay.keys() if content.get(key) != replay.get(key)}
    newest = newest_uncommitted(CHANGELOG, COMMITTED)
    assert all(key in newest and content.get(key) == newest[key] for key in differing), (
        "snapshot + tail equals a plain replay but where the tail holds records of uncommitted messages whose "
        "committed record the tail replay did not see: there it holds the newest of them (at-least-once may "
        f"double, never lose): {differing}"
    )
    assert content[(b"h", b"profile")] == encoded("h2"), "a committed record after an uncommitted one is kept"
    assert content[(b"l", b"profile")] == encoded("l1")


def test_the_next_snapshot_continues_from_the_cut_once_the_commit_finished(spark, kafka_bootstrap, in_flight, tmp_path):
    app, ends = in_flight.app, in_flight.ends
    kafka, topic = {"kafka.bootstrap.servers": kafka_bootstrap}, app.changelog_topic("profiles")
    incremental = SnapshotStore(str(tmp_path / "incremental"), app.name, "profiles")
    first = build_snapshot(spark, kafka, topic, ends, committed(app, CUT_PARTITIONS), incremental)
    commit_source_offsets(app, dict.fromkeys(range(CUT_PARTITIONS), FAR_OFFSET))  # the commit finishes

    second = build_snapshot(spark, kafka, topic, ends, committed(app, CUT_PARTITIONS), incremental)
    full = SnapshotStore(str(tmp_path / "full"), app.name, "profiles")
    from_scratch = build_snapshot(spark, kafka, topic, ends, committed(app, CUT_PARTITIONS), full)

    assert first.end_offsets != ends and second.previous == first.snapshot_id
    assert second.end_offsets == from_scratch.end_offsets == ends
    assert second.extra["partitions_cut_short"] == 0
    rows = snapshot_rows(incremental, second.snapshot_id, CUT_PARTITIONS)
    assert rows == snapshot_rows(full, from_scratch.snapshot_id, CUT_PARTITIONS) == committed_content(CHANGELOG, ends)
    assert rows[(0, scoped("a"))] == encoded("in-flight a") and (0, scoped("d")) not in rows


def test_snapshot_asset_reads_the_committed_offsets_and_shows_the_cut(spark, kafka_bootstrap, in_flight, tmp_path):
    from dagster import materialize

    from dagster_stateful.builder import build_stateful_definitions
    from dagster_stateful.naming import job_name, snapshot_key
    from dagster_stateful.resources import KafkaResource, StatefulSparkResource, StateStoreResource

    app = in_flight.app
    kafka = KafkaResource(bootstrap_servers=kafka_bootstrap)
    state_store = StateStoreResource(state_dir=str(tmp_path / "here"), snapshot_root=str(tmp_path / "snapshots"))
    pyspark = StatefulSparkResource(spark_config={"spark.master": "local[2]"})
    defs = build_stateful_definitions(app, CUT_PARTITIONS, kafka, state_store, spark=pyspark)

    result = materialize(
        [defs.get_assets_def(snapshot_key(app, "profiles"))],
        resources={"kafka": kafka, "state_store": state_store, "spark": pyspark},
    )

    [materialization] = result.asset_materializations_for_node(job_name(app, "snapshots"))
    metadata = {name: value.value for name, value in materialization.metadata.items()}
    assert metadata["end_offsets"] == {"0": 7, "1": 3, "2": 0, "3": 4}
    assert metadata["changelog_end_offsets"] == {str(p): end for p, end in in_flight.ends.items()}
    assert metadata["committed_source_offsets"] == {str(p): o for p, o in COMMITTED.items()}
    assert metadata["partitions_cut_short"] == 3
    assert metadata["records_left_to_replay"] == {"0": 3, "1": 3, "2": 3, "3": 0}
    latest = SnapshotStore(str(tmp_path / "snapshots"), app.name, "profiles").latest()
    assert latest is not None and latest.end_offsets == {0: 7, 1: 3, 2: 0, 3: 4}


def one_partition_app(bootstrap: str, unique_name, tmp_path, name: str) -> tuple[str, App]:
    """A one-partition source of 10 visits and the provisioned app reading it."""
    source = unique_name("visits")
    create_topic(bootstrap, source, partitions=1)
    produce(bootstrap, source, events(0, 10, users=2))
    app = profiles_app(bootstrap, source, tmp_path / "state", unique_name(name))
    app.provision()
    return source, app


def write_changelog(bootstrap: str, topic: str, written: list[tuple[str, Headers | None, str]]) -> None:
    """(user, headers, value) records to partition 0 of the changelog `topic`, in order."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for user, headers, value in written:
        producer.produce(topic, key=scoped(user), value=encoded(value), partition=0, headers=headers)
    assert producer.flush(30) == 0


def test_a_snapshot_stops_at_records_without_headers_past_the_end_the_last_commit_recorded(
    spark, kafka_bootstrap, unique_name, tmp_path
):
    """A worker writes records without headers in commits that record where the changelog ends; a
    crash before the source commit leaves them past the end the group's last commit recorded, where
    they are of uncommitted messages. Metadata of an older engine leaves them committed."""
    source, app = one_partition_app(kafka_bootstrap, unique_name, tmp_path, "bare")
    topic = app.changelog_topic("profiles")
    written = [("a", source_offset_header(0), "a1"), ("b", None, "b1"), ("a", None, "in-flight a"), ("b", None, "b2")]
    write_changelog(kafka_bootstrap, topic, written)

    def snapshot_with_metadata(metadata: str, root: str) -> tuple[SnapshotManifest, SnapshotStore]:
        consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": app.consumer_group})
        try:
            consumer.commit(offsets=[TopicPartition(source, 0, 5, metadata)], asynchronous=False)
        finally:
            consumer.close()
        snapshots = SnapshotStore(str(tmp_path / root), app.name, "profiles")
        options = {"kafka.bootstrap.servers": kafka_bootstrap}
        made = snapshot_changelog(spark, app.kafka, options, app.consumer_group, source, topic, snapshots)
        return made.manifest, snapshots

    manifest, snapshots = snapshot_with_metadata(encode_commit_metadata({}, 5, {"profiles": 2}), "flagged")
    assert manifest.end_offsets == {0: 2}, "cut at the first record without headers past the recorded end"
    assert snapshot_rows(snapshots, manifest.snapshot_id, 1) == {
        (0, scoped("a")): encoded("a1"),
        (0, scoped("b")): encoded("b1"),
    }

    older, snapshots = snapshot_with_metadata('ds2:{"o": 5, "t": {}, "c": {"profiles": 2}}', "older")
    assert older.end_offsets == {0: 4}, "an older engine wrote no such records: all committed"
    assert snapshot_rows(snapshots, older.snapshot_id, 1)[(0, scoped("a"))] == encoded("in-flight a")


def test_a_snapshot_stops_at_a_crashed_commits_block_whatever_the_metadata_says(
    spark, kafka_bootstrap, unique_name, tmp_path
):
    """Each at-least-once commit writes a block (headers on its first record only). After a crash
    between delivering a block and committing the source, and an offset reset that dropped the
    metadata (`--reset-offsets --to-current`), the snapshot still cuts where the crashed block begins."""
    source, app = one_partition_app(kafka_bootstrap, unique_name, tmp_path, "blocks")
    topic = app.changelog_topic("profiles")
    committed_block, crashed_block = block_headers(0, 5, 2), block_headers(5, 10, 2)
    written = [("a", committed_block, "a1"), ("b", None, "b1"), ("a", crashed_block, "a2"), ("b", None, "b2")]
    write_changelog(kafka_bootstrap, topic, written)
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": app.consumer_group})
    try:
        consumer.commit(offsets=[TopicPartition(source, 0, 5, "")], asynchronous=False)
    finally:
        consumer.close()
    snapshots = SnapshotStore(str(tmp_path / "snapshots"), app.name, "profiles")

    options = {"kafka.bootstrap.servers": kafka_bootstrap}
    manifest = snapshot_changelog(spark, app.kafka, options, app.consumer_group, source, topic, snapshots).manifest

    assert manifest.end_offsets == {0: 2}, "cut at the crashed commit's block"
    assert snapshot_rows(snapshots, manifest.snapshot_id, 1) == {
        (0, scoped("a")): encoded("a1"),
        (0, scoped("b")): encoded("b1"),
    }
