"""A snapshot's SST image: its partitions as RocksDB SST files, ready to ingest.

Owns `has_image` and `fetch_image`. The snapshot job writes the image beside the Parquet files
(the same rows, written by Spark tasks as a bulk restore's SST files are; see
`SnapshotStore.image_location`) and the manifest lists each partition's files. Loading a partition
from it is then a copy (a download, for a URI) and an ingest: no Parquet decoding, no work per
key. RocksDB ingests the copies, never the snapshot's own files, which later loads need.
"""

from __future__ import annotations

from pathlib import Path

from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest, SnapshotStore
from dagster_stateful.core.recovery.sst_staging import SstStaging
from dagster_stateful.errors import RecoveryError


def has_image(manifest: SnapshotManifest, partition: int) -> bool:
    """True when the snapshot carries the partition as SST files."""
    return partition in manifest.sst_image


def fetch_image(snapshots: SnapshotStore, manifest: SnapshotManifest, partition: int, scratch: Path) -> list[str]:
    """Local copies, in `scratch`, of the partition's SST files, in key order (`SstStaging.fetch`);
    raises `RecoveryError` naming the file when one cannot be read."""
    location = snapshots.image_location(manifest.snapshot_id)
    names = manifest.sst_image[partition]
    for name in names:
        if not name or "/" in name or name in (".", ".."):
            raise RecoveryError(
                f"snapshot {manifest.snapshot_id} lists SST file {name!r} for partition {partition}, which is not "
                f"a file name inside its image {location}: the manifest is damaged; take a new snapshot"
            )
    staged = [f"{location}/{name}" for name in names]
    written = {partition: (staged, manifest.key_counts.get(partition, 0))}
    return SstStaging(location).fetch(written, scratch, keep_originals=True)[partition][0]
