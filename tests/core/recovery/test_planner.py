"""The restore planner's choices (pure logic: a manifest and offsets in, a path and a reason out)."""

import dataclasses
import time

from dagster_stateful.core.recovery.planner import plan_restore
from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest


def manifest(end: int, keys: int, age_seconds: float = 0.0) -> SnapshotManifest:
    return SnapshotManifest(
        app="a",
        store="s",
        changelog_topic="a-s-changelog",
        snapshot_id="snapshot-1",
        created_at=time.time() - age_seconds,
        end_offsets={0: end},
        key_counts={0: keys},
    )


def test_up_to_date_state_needs_nothing():
    assert plan_restore(0, local_offset=500, changelog_low=0, changelog_high=500).path == "none"


def test_short_tails_are_replayed_even_with_a_snapshot():
    plan = plan_restore(
        0, local_offset=9_900, changelog_low=0, changelog_high=10_000, snapshot=manifest(end=9_950, keys=1_000_000)
    )
    assert plan.path == "changelog" and "replay 100 changelog records" in plan.reason


def test_a_big_snapshot_beats_a_long_replay_and_says_why():
    plan = plan_restore(
        0,
        local_offset=None,
        changelog_low=0,
        changelog_high=8_000_000,
        snapshot=manifest(end=7_900_000, keys=1_000_000),
    )
    assert plan.path == "snapshot"
    assert "1000000 keys" in plan.reason and "replay 100000 records" in plan.reason and "changelog ~" in plan.reason


def test_spark_wins_only_with_enough_cores_for_the_state():
    big = manifest(end=50_000_000, keys=40_000_000)
    assert plan_restore(0, None, 0, 50_000_000, big, spark_cores=2).path == "snapshot"
    assert plan_restore(0, None, 0, 50_000_000, big, spark_cores=64).path == "spark"


def test_unusable_snapshots_fall_back_to_the_changelog_with_the_reason():
    beyond = plan_restore(0, None, 0, 1_000, manifest(end=5_000, keys=10))
    assert beyond.path == "changelog" and "beyond the changelog's end" in beyond.reason
    older_than_local = plan_restore(0, 900, 0, 1_000_000, manifest(end=800, keys=10))
    assert older_than_local.path == "changelog" and "newer than snapshot" in older_than_local.reason
    stale = plan_restore(
        0, None, 0, 10_000_000, manifest(end=9_000_000, keys=10, age_seconds=7200), max_snapshot_age_seconds=3600
    )
    assert stale.path == "changelog" and "older than 3600 s" in stale.reason


def test_a_snapshot_image_wins_where_loading_its_parquet_rows_would_not():
    # A local store 200k records behind: the replay takes ~1 s; loading 1M keys from Parquet takes longer.
    rows = manifest(end=1_000_000, keys=1_000_000)
    image = dataclasses.replace(rows, sst_image={0: ["p0-00000.sst"]})

    without = plan_restore(0, 900_000, 0, 1_100_000, rows)
    with_image = plan_restore(0, 900_000, 0, 1_100_000, image)

    assert without.path == "changelog"
    assert with_image.path == "snapshot" and "ingest the SST image of 1000000 keys" in with_image.reason
    assert with_image.estimated_seconds < without.estimated_seconds
