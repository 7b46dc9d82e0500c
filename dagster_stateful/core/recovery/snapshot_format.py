"""Snapshots of a store: compacted images of its changelog, as Parquet plus a manifest.

Owns the snapshot layout and its manifest, readable without Spark (pyarrow):
`<root>/<app>/<store>/snapshot-<created ms>/partition=<p>/*.parquet` (a partitioned table's store:
`<root>/<app>/tables/<table>/...`) holds the latest value of
every live key of Kafka partition p, sorted by the raw key bytes, with columns `key`, `value`,
`offset` (the changelog offset of that value); `_manifest.json`, written last, records the
changelog end offset each partition covers, key counts and the creation time, so a snapshot
without a manifest is an unfinished one and is ignored. `_table/` beside them holds the decoded
table (`state_table`); `_sst_image/`, when the manifest lists it, the same rows as SST files ready
for RocksDB to ingest (`snapshot_image`). `root` is a local path or a URI pyarrow
reads (file://, s3://, gs://, hdfs://; Spark's s3a:// is read as s3://).

pyarrow is imported where a snapshot is first touched, not with this module: a worker imports it
for `SnapshotManifest`, and one whose app keeps no snapshots is spared pyarrow's (and NumPy's) 50 MiB and
quarter of a second.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow.fs as pafs

MANIFEST = "_manifest.json"
SNAPSHOT_PREFIX = "snapshot-"
TABLE_DIR = "_table"
IMAGE_DIR = "_sst_image"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class SnapshotManifest:
    app: str
    store: str
    changelog_topic: str
    snapshot_id: str
    created_at: float
    end_offsets: dict[int, int]
    """Per partition: the changelog offset up to which (exclusive) the snapshot holds everything. It
    never passes the first record of a message the group had not committed when the snapshot was
    built, so it may stop short of the changelog's end; the replay after a load covers the rest."""
    key_counts: dict[int, int]
    previous: str | None = None
    sst_image: dict[int, list[str]] = field(default_factory=dict)
    """Per partition: the names of its SST files under `SnapshotStore.image_location`, in key order
    (an empty list: the partition has no keys). A partition missing here has no image and is loaded
    from the Parquet files."""
    format: int = FORMAT_VERSION
    extra: dict = field(default_factory=dict)

    @property
    def age_seconds(self) -> float:
        return max(0.0, time.time() - self.created_at)

    def to_json(self) -> str:
        data = asdict(self)
        data["end_offsets"] = {str(p): o for p, o in sorted(self.end_offsets.items())}
        data["key_counts"] = {str(p): n for p, n in sorted(self.key_counts.items())}
        data["sst_image"] = {str(p): files for p, files in sorted(self.sst_image.items())}
        return json.dumps(data, indent=2)

    @classmethod
    def from_json(cls, text: str) -> SnapshotManifest:
        data = json.loads(text)
        data["end_offsets"] = {int(p): int(o) for p, o in data["end_offsets"].items()}
        data["key_counts"] = {int(p): int(n) for p, n in data["key_counts"].items()}
        data["sst_image"] = {int(p): [str(name) for name in files] for p, files in data.get("sst_image", {}).items()}
        return cls(**data)


class SnapshotStore:
    """The snapshots of one store under a root path or URI."""

    def __init__(self, root: str, app: str, store: str, directory: str | None = None) -> None:
        """directory: where under the app's folder the snapshots live (default: the store's name;
        a partitioned table's store keeps them under `tables/<table>`, `table_snapshots`)."""
        self.root = (root if "://" in root else os.path.abspath(root)).rstrip("/")
        self.app = app
        self.store = store
        self.directory = directory or store
        self._fs, self._base = filesystem(self.location)

    @property
    def location(self) -> str:
        """Where this store's snapshots live, as given (for Spark)."""
        return f"{self.root}/{self.app}/{self.directory}"

    def new_snapshot_id(self) -> str:
        return f"{SNAPSHOT_PREFIX}{int(time.time() * 1000)}"

    def snapshot_location(self, snapshot_id: str) -> str:
        return f"{self.location}/{snapshot_id}"

    def table_location(self, snapshot_id: str) -> str:
        """Where the snapshot's decoded table lives (`state_table`): Parquet files any engine reads,
        in a directory Spark's readers of the raw snapshot skip (a leading `_`)."""
        return f"{self.snapshot_location(snapshot_id)}/{TABLE_DIR}"

    def image_location(self, snapshot_id: str) -> str:
        """Where the snapshot's SST image lives: a directory Spark's readers of the raw snapshot skip."""
        return f"{self.snapshot_location(snapshot_id)}/{IMAGE_DIR}"

    def filesystem_path(self, snapshot_id: str, *parts: str) -> tuple[pafs.FileSystem, str]:
        """The filesystem of the snapshots and the path in it of `parts` inside the snapshot."""
        return self._fs, "/".join([self._base, snapshot_id, *parts])

    def staging_location(self, snapshot_id: str, run: str) -> str:
        """Where one bulk restore from `snapshot_id` stages its SST files: inside the snapshot, in a
        directory Spark's readers skip (a leading `_`), pruned with the snapshot."""
        return f"{self.snapshot_location(snapshot_id)}/_sst/{run}"

    def manifests(self) -> list[SnapshotManifest]:
        """Finished snapshots, oldest first."""
        found = []
        for snapshot_id in self._snapshot_ids():
            path = f"{self._base}/{snapshot_id}/{MANIFEST}"
            try:
                with self._fs.open_input_stream(path) as stream:
                    found.append(SnapshotManifest.from_json(stream.read().decode()))
            except (FileNotFoundError, OSError, ValueError, KeyError, TypeError):
                continue
        return found

    def latest(self) -> SnapshotManifest | None:
        manifests = self.manifests()
        return manifests[-1] if manifests else None

    def write_manifest(self, manifest: SnapshotManifest) -> None:
        """Publish a snapshot: its files are complete once this exists."""
        with self._fs.open_output_stream(f"{self._base}/{manifest.snapshot_id}/{MANIFEST}") as stream:
            stream.write(manifest.to_json().encode())

    def write_partition(
        self, snapshot_id: str, partition: int, rows: list[tuple[bytes, bytes]], offsets: list[int]
    ) -> None:
        """One partition's rows (sorted by key) and each one's changelog offset, as Spark writes a snapshot's."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table(
            {
                "key": pa.array([key for key, _ in rows], pa.binary()),
                "value": pa.array([value for _, value in rows], pa.binary()),
                "offset": pa.array(offsets, pa.int64()),
            }
        )
        directory = f"{self._base}/{snapshot_id}/partition={partition}"
        self._fs.create_dir(directory, recursive=True)
        pq.write_table(table, f"{directory}/part-00000.parquet", filesystem=self._fs)

    def count_keys(self, snapshot_id: str, partitions: list[int]) -> dict[int, int]:
        """Rows per partition, from the Parquet footers (no data is read)."""
        import pyarrow.parquet as pq

        counts = {}
        for partition in partitions:
            counts[partition] = sum(
                pq.ParquetFile(self._fs.open_input_file(path)).metadata.num_rows
                for path in self._parquet_files(snapshot_id, partition)
            )
        return counts

    def read_partition(
        self, snapshot_id: str, partition: int, batch_rows: int = 262_144
    ) -> Iterator[tuple[list[bytes], list[bytes]]]:
        """(keys, values) batches of one partition, in key order."""
        import pyarrow.parquet as pq

        for path in self._parquet_files(snapshot_id, partition):
            parquet = pq.ParquetFile(self._fs.open_input_file(path))
            for batch in parquet.iter_batches(batch_size=batch_rows, columns=["key", "value"]):
                yield batch.column(0).to_pylist(), batch.column(1).to_pylist()

    def read_offsets(self, snapshot_id: str, partition: int) -> dict[bytes, int]:
        """Each key of one partition with the changelog offset of its value."""
        import pyarrow.parquet as pq

        offsets: dict[bytes, int] = {}
        for path in self._parquet_files(snapshot_id, partition):
            table = pq.read_table(path, filesystem=self._fs, columns=["key", "offset"])
            offsets.update(zip(table.column(0).to_pylist(), table.column(1).to_pylist(), strict=True))
        return offsets

    def read_value(self, snapshot_id: str, partition: int, key: bytes) -> bytes | None:
        """One key's value in one partition, or None (row groups whose key statistics exclude it are not read)."""
        import pyarrow.parquet as pq

        for path in self._parquet_files(snapshot_id, partition):
            found = pq.read_table(path, filesystem=self._fs, columns=["value"], filters=[("key", "==", key)])
            if found.num_rows:
                return found.column(0)[0].as_py()
        return None

    def prune(self, keep: int) -> list[str]:
        """Delete all but the newest `keep` finished snapshots (and unfinished older ones)."""
        finished = [m.snapshot_id for m in self.manifests()]
        kept = set(finished[-keep:]) if keep > 0 else set()
        newest = finished[-1] if finished else None
        deleted = []
        for snapshot_id in self._snapshot_ids():
            unfinished_and_older = snapshot_id not in finished and newest is not None and snapshot_id < newest
            if (snapshot_id in finished and snapshot_id not in kept) or unfinished_and_older:
                self._fs.delete_dir(f"{self._base}/{snapshot_id}")
                deleted.append(snapshot_id)
        return deleted

    def _snapshot_ids(self) -> list[str]:
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self._base, allow_not_found=True)
        ids = [
            info.base_name
            for info in self._fs.get_file_info(selector)
            if info.type == pafs.FileType.Directory and info.base_name.startswith(SNAPSHOT_PREFIX)
        ]
        return sorted(ids, key=lambda name: int(name.removeprefix(SNAPSHOT_PREFIX)))

    def _parquet_files(self, snapshot_id: str, partition: int) -> list[str]:
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(f"{self._base}/{snapshot_id}/partition={partition}", allow_not_found=True)
        return sorted(
            info.path
            for info in self._fs.get_file_info(selector)
            if info.type == pafs.FileType.File and info.base_name.endswith(".parquet")
        )


def filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem of a path or URI, and the path within it."""
    import pyarrow.fs as pafs

    if "://" not in location:
        return pafs.LocalFileSystem(), str(location)
    if location.startswith("s3a://"):
        location = "s3://" + location.removeprefix("s3a://")
    return pafs.FileSystem.from_uri(location)
