"""SST files on their way from the tasks that write them to the worker that ingests them.

Owns `SstStaging`, one bulk restore's staging directory (see `SnapshotStore.staging_location`),
a plain path or a URI pyarrow reaches. A plain path is taken to be visible to the writers and the
ingesting worker alike (local Spark, a shared mount): tasks write their files there and the worker
ingests them in place. A URI (`file://`, `s3://`, `s3a://`, `gs://`, `hdfs://`) needs no shared
mount: each task writes into its own scratch directory and uploads, and the worker downloads
exactly the files the successful tasks reported, never a listing (a failed attempt's leftovers are
never ingested). Files that must outlive the ingest (a snapshot's SST image) are copied into the
worker's scratch directory either way (`fetch(..., keep_originals=True)`). The report itself can
be staged too (`write_report`/`read_report`) for launchers whose writers run in another process
(spark-submit through Dagster Pipes).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dagster_stateful.core.recovery.snapshot_format import filesystem
from dagster_stateful.errors import RecoveryError

log = logging.getLogger(__name__)

REPORT = "_files.json"
_COPY_BUFFER = 8 << 20

WrittenFiles = dict[int, tuple[list[str], int]]
"""partition -> (SST files in key order, keys written)."""


class SstStaging:
    """One bulk restore's staging directory."""

    def __init__(self, location: str) -> None:
        self.location = location.rstrip("/")
        self._fs, self._base = filesystem(self.location)

    @property
    def in_place(self) -> bool:
        """True for a plain path: written and ingested where they lie, with no copies."""
        return "://" not in self.location

    @contextmanager
    def task_directory(self) -> Iterator[Path]:
        """The local directory a task writes its files into before `publish`."""
        if self.in_place:
            Path(self.location).mkdir(parents=True, exist_ok=True)
            yield Path(self.location)
            return
        with tempfile.TemporaryDirectory(prefix="sst-task-") as scratch:
            yield Path(scratch)

    def publish(self, local_files: list[str]) -> list[str]:
        """Make a task's files visible to the ingesting worker; returns where they are staged."""
        if self.in_place:
            return local_files
        staged = []
        if local_files:
            self._fs.create_dir(self._base, recursive=True)
        for local in local_files:
            target = f"{self._base}/{Path(local).name}"
            with open(local, "rb") as source, self._fs.open_output_stream(target) as sink:
                shutil.copyfileobj(source, sink, _COPY_BUFFER)
            staged.append(f"{self.location}/{Path(local).name}")
        return staged

    def write_report(self, written: WrittenFiles) -> None:
        """Record what the successful tasks wrote, for a launcher in another process."""
        self._fs.create_dir(self._base, recursive=True)
        report = {str(p): {"files": files, "keys": keys} for p, (files, keys) in written.items()}
        with self._fs.open_output_stream(f"{self._base}/{REPORT}") as sink:
            sink.write(json.dumps(report).encode())

    def read_report(self) -> WrittenFiles:
        path = f"{self.location}/{REPORT}"
        try:
            with self._fs.open_input_stream(f"{self._base}/{REPORT}") as stream:
                report = json.loads(stream.read().decode())
            return {int(p): (list(entry["files"]), int(entry["keys"])) for p, entry in report.items()}
        except FileNotFoundError as error:
            raise RecoveryError(
                f"the SST writer finished without its report {path}: it failed or wrote elsewhere; "
                "see its log, then run the restore again"
            ) from error
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise RecoveryError(f"unreadable SST report {path} ({error}); run the restore again") from error

    def fetch(self, written: WrittenFiles, scratch: Path, keep_originals: bool = False) -> WrittenFiles:
        """The reported files as local paths the worker can ingest, downloaded into `scratch` unless in
        place; `keep_originals`: copied into `scratch` even in place, since ingesting moves a file."""
        fetched: WrittenFiles = {}
        copied = 0
        copying = keep_originals or not self.in_place
        if copying:
            scratch.mkdir(parents=True, exist_ok=True)
        for partition, (files, keys) in written.items():
            local = []
            for staged in files:
                self._check_inside(staged, partition)
                if not copying:
                    local.append(staged)
                    continue
                target = scratch / f"p{partition}-{len(local):05d}-{Path(staged).name}"
                copied += self._download(staged, target, partition)
                local.append(str(target))
            fetched[partition] = (local, keys)
        if copying:
            count = sum(len(files) for files, _ in written.values())
            log.info("Fetched %d SST files (%.1f MiB) from %s", count, copied / (1 << 20), self.location)
        return fetched

    def remove(self) -> None:
        """Delete the staging directory and whatever is left in it (ingested files were moved)."""
        try:
            self._fs.delete_dir(self._base)
        except FileNotFoundError:
            return
        except OSError as error:
            log.warning("Could not delete the SST staging directory %s (%s); delete it by hand", self.location, error)

    def _download(self, staged: str, target: Path, partition: int) -> int:
        if self.in_place:
            return self._copy(staged, target, partition)
        try:
            source = self._fs.open_input_stream(self._path_of(staged))
        except FileNotFoundError as error:
            raise RecoveryError(
                f"SST file {staged} of partition {partition}, reported by a successful Spark task, is missing "
                f"from {self.location}: something deleted it during the restore; run the restore again"
            ) from error
        with source, open(target, "wb") as sink:
            shutil.copyfileobj(source, sink, _COPY_BUFFER)
        return target.stat().st_size

    def _copy(self, staged: str, target: Path, partition: int) -> int:
        try:
            shutil.copyfile(staged, target)  # in the kernel where the file system allows
        except OSError as error:
            raise RecoveryError(
                f"SST file {staged} of partition {partition} cannot be copied from {self.location} ({error}): "
                "it is missing or unreadable; run the restore again, or take a new snapshot"
            ) from error
        return target.stat().st_size

    def _check_inside(self, staged: str, partition: int) -> None:
        name = staged.removeprefix(self.location + "/")
        if name == staged or not name or "/" in name:
            raise RecoveryError(
                f"SST file {staged} of partition {partition} lies outside the staging directory {self.location}: "
                "the SST writer and the restore disagree on the staging location"
            )

    def _path_of(self, staged: str) -> str:
        return f"{self._base}/{staged.removeprefix(self.location + '/')}"
