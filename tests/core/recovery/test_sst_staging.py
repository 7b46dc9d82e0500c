"""SST staging between Spark tasks and the ingesting worker: in place for a plain path; uploaded and
fetched for a URI, which needs no shared mount; only reported files are ever fetched."""

from pathlib import Path

import pytest

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.recovery.snapshot_format import SnapshotStore
from dagster_stateful.core.recovery.sst_staging import SstStaging
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.rocksdb import SortedSstWriter
from dagster_stateful.errors import RecoveryError


def task_writes(staging: SstStaging, partition: int, pairs: list[tuple[bytes, bytes]]) -> list[str]:
    """What a Spark task does: write sorted pairs in its directory, then publish."""
    with staging.task_directory() as directory:
        writer = SortedSstWriter(directory, f"p{partition}-task", records_per_file=2)
        for key, value in pairs:
            writer.put(key, value)
        return staging.publish([file.path for file in writer.finish()])


def ingest(files: list[str], into: Path) -> dict[bytes, bytes]:
    part = StateDirectory(into, AppConfig(name="app", source="orders", stores=("store",))).partition("store", 0)
    part.open()
    try:
        part.db.ingest_files(files)
        return dict(part.items())
    finally:
        part.close()


def test_a_uri_stages_by_upload_and_the_worker_fetches_exactly_the_reported_files(tmp_path):
    snapshots = SnapshotStore(f"file://{tmp_path}/snapshots", "app", "store")
    staging = SstStaging(snapshots.staging_location("snapshot-1", "run"))
    assert not staging.in_place
    pairs = [(f"k{i:02d}".encode(), f"v{i}".encode()) for i in range(5)]
    staged = task_writes(staging, 0, pairs)
    assert len(staged) == 3 and all(f.startswith(staging.location + "/") for f in staged)
    task_writes(staging, 1, [(b"leftover", b"of a failed attempt")])  # staged, never reported

    staging.write_report({0: (staged, 5)})
    report = SstStaging(staging.location).read_report()  # another process reads it back
    fetched = staging.fetch(report, tmp_path / "scratch")

    files, keys = fetched[0]
    assert keys == 5 and [Path(f).parent for f in files] == [tmp_path / "scratch"] * 3
    assert ingest(files, tmp_path / "db") == dict(pairs)
    staging.remove()
    assert not (tmp_path / "snapshots/app/store/snapshot-1/_sst/run").exists()


def test_a_plain_path_is_written_and_ingested_in_place(tmp_path):
    staging = SstStaging(SnapshotStore(str(tmp_path / "snapshots"), "app", "store").staging_location("s", "run"))
    assert staging.in_place
    staged = task_writes(staging, 0, [(b"a", b"1"), (b"b", b"2")])
    assert staging.fetch({0: (staged, 2)}, tmp_path / "unused") == {0: (staged, 2)}
    assert not (tmp_path / "unused").exists()


def test_a_reported_file_outside_the_staging_location_is_refused(tmp_path):
    staging = SstStaging(f"file://{tmp_path}/staging")
    elsewhere = f"file://{tmp_path}/elsewhere/p0.sst"
    with pytest.raises(RecoveryError, match=r"p0\.sst of partition 0 lies outside the staging directory"):
        staging.fetch({0: ([elsewhere], 1)}, tmp_path / "scratch")


def test_a_missing_file_or_report_says_where_and_what_to_do(tmp_path):
    staging = SstStaging(f"file://{tmp_path}/staging")
    with pytest.raises(RecoveryError, match=r"without its report .*_files\.json.*run the restore again"):
        staging.read_report()
    missing = f"{staging.location}/p3-gone.sst"
    (tmp_path / "scratch").mkdir()
    with pytest.raises(RecoveryError, match=r"p3-gone\.sst of partition 3.*is missing from.*run the restore again"):
        staging.fetch({3: ([missing], 1)}, tmp_path / "scratch")
