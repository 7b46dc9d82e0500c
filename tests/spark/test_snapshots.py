"""Compaction snapshots built by Spark from a real changelog, and local bulk restores from them."""

import orjson
import pytest
from core_helpers import store_content
from kafka_helpers import create_topic, produce, read_keyed

from dagster_stateful.core import App, State
from dagster_stateful.core.recovery.snapshot_load import load_snapshot_partition
from dagster_stateful.core.recovery.snapshots import SnapshotStore
from dagster_stateful.core.recovery.verification import partition_digest
from dagster_stateful.spark.snapshots import build_snapshot

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


def snapshot_rows(snapshots: SnapshotStore, snapshot_id: str) -> dict[tuple[int, bytes], bytes]:
    rows = {}
    for partition in range(PARTITIONS):
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
        spark, {"kafka.bootstrap.servers": kafka_bootstrap}, profiles.changelog_topic("profiles"), ends, snapshots
    )

    rows = snapshot_rows(snapshots, manifest.snapshot_id)
    assert {key: value for (_, key), value in rows.items()} == live_changelog(kafka_bootstrap, profiles)
    assert manifest.end_offsets == ends
    assert manifest.key_counts == {p: sum(1 for (q, _) in rows if q == p) for p in range(PARTITIONS)}
    assert snapshots.latest() == manifest


def test_incremental_snapshots_equal_a_full_one(spark, kafka_bootstrap, profiles, tmp_path):
    kafka = {"kafka.bootstrap.servers": kafka_bootstrap}
    incremental = SnapshotStore(str(tmp_path / "incremental"), profiles.name, "profiles")
    first = build_snapshot(spark, kafka, profiles.changelog_topic("profiles"), changelog_ends(profiles), incremental)
    produce(kafka_bootstrap, profiles.source, events(600, 300, users=120, delete_every=5))
    profiles.run_worker(max_seconds=120)
    ends = changelog_ends(profiles)

    second = build_snapshot(spark, kafka, profiles.changelog_topic("profiles"), ends, incremental, keep=1)
    full = SnapshotStore(str(tmp_path / "full"), profiles.name, "profiles")
    from_scratch = build_snapshot(spark, kafka, profiles.changelog_topic("profiles"), ends, full)

    assert second.previous == first.snapshot_id
    assert snapshot_rows(incremental, second.snapshot_id) == snapshot_rows(full, from_scratch.snapshot_id)
    assert [m.snapshot_id for m in incremental.manifests()] == [second.snapshot_id], "older snapshots pruned"


def test_local_snapshot_restore_equals_a_replay_and_the_worker_continues(spark, kafka_bootstrap, profiles, tmp_path):
    snapshots = SnapshotStore(str(tmp_path / "snapshots"), profiles.name, "profiles")
    manifest = build_snapshot(
        spark,
        {"kafka.bootstrap.servers": kafka_bootstrap},
        profiles.changelog_topic("profiles"),
        changelog_ends(profiles),
        snapshots,
    )
    produce(kafka_bootstrap, profiles.source, events(600, 200, users=90, delete_every=3))
    profiles.run_worker(max_seconds=120)  # the changelog moves past the snapshot: a tail to replay
    restored = profiles.bind(state_dir=tmp_path / "restored")

    for partition in range(PARTITIONS):
        store = restored.state.partition("profiles", partition)
        store.open()
        try:
            report = load_snapshot_partition(store, snapshots, manifest, changelog_ends(profiles)[partition])
            assert report.kind == "snapshot" and report.records_applied == manifest.key_counts[partition]
            assert store.changelog_offset == manifest.end_offsets[partition]
        finally:
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
