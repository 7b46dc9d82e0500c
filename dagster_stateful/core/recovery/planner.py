"""The restore planner: which of the three restore paths to take for a partition, and why.

Owns `plan_restore`. The paths: replay the changelog (tail, or everything without local state);
load the latest snapshot locally (its SST image, or SST files from its sorted Parquet) and replay
the tail after it; or have Spark write the SST files (worth it when state is large and Spark has many cores).
Each is estimated in seconds from measured rates, the fastest wins, and the reason names the
figures so a run's metadata says what was chosen and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest

# Measured on a 2-core machine (bench/bench_restore.py): changelog replay ~195k records/s; snapshot
# load (pyarrow read + SST write + ingest) ~1.2M keys/s in one process (more with several partitions,
# which load in parallel), and far more from the snapshot's SST image (a copy and an ingest); Spark
# local[2] ~250k keys/s after a ~10 s session start.
REPLAY_RECORDS_PER_SECOND = 200_000
SNAPSHOT_KEYS_PER_SECOND = 1_000_000
SNAPSHOT_IMAGE_KEYS_PER_SECOND = 10_000_000
SPARK_KEYS_PER_SECOND_PER_CORE = 125_000
SPARK_STARTUP_SECONDS = 10.0


class RestorePath(StrEnum):
    """The way a partition is brought up to date."""

    NONE = "none"
    """Already at the changelog's end."""
    CHANGELOG = "changelog"
    SNAPSHOT = "snapshot"
    SPARK = "spark"
    SKIPPED = "skipped"
    """Not restored here: a running worker holds the partition and restores it itself."""


class RestoreMethod(StrEnum):
    """What a restore run asks for: the planner's choice, or one path forced."""

    AUTO = "auto"
    CHANGELOG = "changelog"
    SNAPSHOT = "snapshot"
    SPARK = "spark"


@dataclass(frozen=True)
class RestorePlan:
    partition: int
    path: RestorePath
    reason: str
    estimated_seconds: float


def plan_restore(
    partition: int,
    local_offset: int | None,
    changelog_low: int,
    changelog_high: int,
    snapshot: SnapshotManifest | None = None,
    spark_cores: int = 0,
    max_snapshot_age_seconds: float | None = None,
) -> RestorePlan:
    """local_offset: the partition's stored changelog offset (None: no local state).
    spark_cores: cores Spark can use for the restore (0: Spark is not configured)."""
    start = local_offset if local_offset is not None else changelog_low
    tail = max(0, changelog_high - start)
    if tail == 0:
        return RestorePlan(partition, RestorePath.NONE, "local state is at the changelog's end", 0.0)
    replay = RestorePlan(
        partition, RestorePath.CHANGELOG, f"replay {tail} changelog records", tail / REPLAY_RECORDS_PER_SECOND
    )
    usable, why_not = _snapshot_usable(partition, start, changelog_high, snapshot, max_snapshot_age_seconds)
    if not usable:
        return RestorePlan(partition, RestorePath.CHANGELOG, f"{replay.reason}; {why_not}", replay.estimated_seconds)
    assert snapshot is not None
    keys, after = snapshot.key_counts.get(partition, 0), changelog_high - snapshot.end_offsets[partition]
    candidates = [replay, _snapshot_plan(partition, snapshot, keys, after)]
    if spark_cores > 0:
        candidates.append(
            RestorePlan(
                partition,
                RestorePath.SPARK,
                f"Spark writes SST files for {keys} keys on {spark_cores} cores, then replay {after}",
                SPARK_STARTUP_SECONDS
                + keys / (SPARK_KEYS_PER_SECOND_PER_CORE * spark_cores)
                + after / REPLAY_RECORDS_PER_SECOND,
            )
        )
    best = min(candidates, key=lambda plan: plan.estimated_seconds)
    others = ", ".join(f"{c.path} ~{c.estimated_seconds:.1f}s" for c in candidates if c is not best)
    return RestorePlan(
        partition, best.path, f"{best.reason} (~{best.estimated_seconds:.1f}s; {others})", best.estimated_seconds
    )


def _snapshot_plan(partition: int, snapshot: SnapshotManifest, keys: int, after: int) -> RestorePlan:
    if partition in snapshot.sst_image:
        how, rate = f"ingest the SST image of {keys} keys", SNAPSHOT_IMAGE_KEYS_PER_SECOND
    else:
        how, rate = f"load {keys} keys", SNAPSHOT_KEYS_PER_SECOND
    return RestorePlan(
        partition,
        RestorePath.SNAPSHOT,
        f"{how} of snapshot {snapshot.snapshot_id} and replay {after} records",
        keys / rate + after / REPLAY_RECORDS_PER_SECOND,
    )


def _snapshot_usable(
    partition: int, start: int, high: int, snapshot: SnapshotManifest | None, max_age: float | None
) -> tuple[bool, str]:
    if snapshot is None:
        return False, "no snapshot"
    end = snapshot.end_offsets.get(partition)
    if end is None:
        return False, f"snapshot {snapshot.snapshot_id} lacks partition {partition}"
    if end > high:
        return False, f"snapshot {snapshot.snapshot_id} is beyond the changelog's end (changelog recreated?)"
    if end <= start:
        return False, f"local state is newer than snapshot {snapshot.snapshot_id}"
    if max_age is not None and snapshot.age_seconds > max_age:
        return False, f"snapshot {snapshot.snapshot_id} is older than {max_age:.0f} s"
    return True, ""
