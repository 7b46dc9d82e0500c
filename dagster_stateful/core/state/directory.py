"""The state directory: where an app's local state lives on disk, as in Kafka Streams' `StateDirectory`.

Owns the layout `<root>/<app>/<store>/<partition>/` (one RocksDB per store partition, with its
`.lock` and `.checkpoint`), how long opening a partition waits for its lock, the app's activity
lock (held shared by running workers, taken exclusively to delete state), listing what is on disk,
deleting it, and the `.corrupt-<ms>` copies a corrupted partition is moved to (kept for
inspection, pruned by age and count so that they never pile up). It is the one place that builds
a `StorePartition`.
"""

from __future__ import annotations

import logging
import shutil
import socket
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol

from dagster_stateful.core.state.backend import BackendFactory
from dagster_stateful.core.state.checkpoint import Checkpoint, read_checkpoint
from dagster_stateful.core.state.locks import DEFAULT_LOCK_TIMEOUT_SECONDS, AppActivityLock
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.rocksdb import PartitionDatabase
from dagster_stateful.errors import ConfigurationError, StateLockedError, StateStoreError

log = logging.getLogger(__name__)

GLOBAL_TABLES_DIR = "global-tables"
"""Where a worker keeps its copies of the app's global tables, under the app's directory."""

TABLES_DIR = "tables"
"""Where a worker keeps the partitions of the app's partitioned tables it holds, under the app's directory."""

CORRUPT_MARKER = ".corrupt-"
DEFAULT_CORRUPT_RETENTION_SECONDS = 7 * 24 * 3600.0
DEFAULT_CORRUPT_COPIES_KEPT = 2


class AppLayout(Protocol):
    """What the directory needs of an app's configuration (`AppConfig` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def task_topic(self) -> str: ...
    @property
    def stores(self) -> tuple[str, ...]: ...
    @property
    def store_backends(self) -> Mapping[str, BackendFactory]: ...
    def changelog_topic(self, store: str) -> str: ...


class StateDirectory:
    """The local state of one app under `root`."""

    def __init__(
        self,
        root: str | Path,
        config: AppLayout,
        corrupt_retention_seconds: float = DEFAULT_CORRUPT_RETENTION_SECONDS,
        corrupt_copies_kept: int = DEFAULT_CORRUPT_COPIES_KEPT,
        lock_timeout_seconds: float = DEFAULT_LOCK_TIMEOUT_SECONDS,
    ) -> None:
        """corrupt_retention_seconds / corrupt_copies_kept: `.corrupt-*` copies older than this, or
        beyond this many per partition (newest kept), are deleted when a new one is made.
        lock_timeout_seconds: how long opening a partition waits for another holder of its lock (a
        worker handing it over) before `StateLockedError`; `StorePartition.open(lock_timeout=...)`
        overrides it per call (0 fails at once)."""
        if lock_timeout_seconds < 0:
            raise ConfigurationError(f"lock_timeout_seconds is zero or more, got {lock_timeout_seconds}")
        self.root = Path(root)
        self.config = config
        self.corrupt_retention_seconds = corrupt_retention_seconds
        self.corrupt_copies_kept = corrupt_copies_kept
        self.lock_timeout_seconds = lock_timeout_seconds

    @property
    def app_dir(self) -> Path:
        return self.root / self.config.name

    def store_dir(self, store: str) -> Path:
        return self.app_dir / store

    def partition_path(self, store: str, partition: int) -> Path:
        return self.store_dir(store) / str(partition)

    def partition(self, store: str, partition: int) -> StorePartition:
        """The store partition (closed: `open()` it, which takes its lock)."""
        return StorePartition(
            self.partition_path(store, partition),
            store,
            partition,
            self.config.changelog_topic(store),
            self.config.task_topic,
            quarantine=self._move_aside,
            lock_timeout=self.lock_timeout_seconds,
            backend=self.config.store_backends.get(store, PartitionDatabase),
        )

    def read_checkpoint(self, store: str, partition: int) -> Checkpoint | None:
        """The partition's `.checkpoint` (its offsets), read without opening RocksDB."""
        return read_checkpoint(self.partition_path(store, partition))

    def local_partitions(self, store: str) -> list[int]:
        """Partitions of `store` that have a directory here, in order."""
        store_dir = self.store_dir(store)
        if not store_dir.is_dir():
            return []
        return sorted(int(entry.name) for entry in store_dir.iterdir() if entry.is_dir() and entry.name.isdigit())

    def bytes_on_disk(self, store: str, partition: int) -> int:
        path = self.partition_path(store, partition)
        if not path.exists():
            return 0
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())

    def activity_lock(self) -> AppActivityLock:
        return AppActivityLock(self.app_dir / ".app.lock")

    @property
    def worker_client_id(self) -> str:
        """The Kafka client.id of this app's workers on this state directory: says which host and
        directory own a partition, so a sensor can tell its own machine's copies from others'."""
        return f"{self.config.name}@{socket.gethostname()}:{self.root.resolve()}"

    def clear(self, stores: Iterable[str] | None = None, partitions: Iterable[int] | None = None) -> list[Path]:
        """Delete local state (all, global tables' copies included, or some stores / partitions).
        Refused while a worker of the app runs."""
        lock = self.activity_lock()
        if not lock.try_exclusive():
            raise StateLockedError(
                f"a worker of app {self.config.name!r} is running on {self.app_dir}; stop it before clearing its state"
            )
        try:
            chosen = None if partitions is None else list(partitions)
            deleted = []
            for store in stores or self.config.stores:
                targets = [self.store_dir(store)] if chosen is None else [self.partition_path(store, p) for p in chosen]
                for target in targets:
                    if target.exists():
                        shutil.rmtree(target)
                        deleted.append(target)
                        log.info("Deleted local state %s", target)
            for tables_dir in (GLOBAL_TABLES_DIR, TABLES_DIR):
                copies = self.app_dir / tables_dir
                if stores is None and chosen is None and copies.exists():
                    shutil.rmtree(copies)
                    deleted.append(copies)
                    log.info("Deleted the tables' local state %s", copies)
            return deleted
        finally:
            lock.release()

    def corrupt_copies(self, store: str, partition: int | None = None) -> list[Path]:
        """The `.corrupt-*` copies of a store's partitions (of one partition if given), oldest first."""
        store_dir = self.store_dir(store)
        if not store_dir.is_dir():
            return []
        prefix = f"{partition}{CORRUPT_MARKER}" if partition is not None else None
        copies = [
            entry
            for entry in store_dir.iterdir()
            if CORRUPT_MARKER in entry.name and (prefix is None or entry.name.startswith(prefix))
        ]
        return sorted(copies, key=_copy_time)

    def _move_aside(self, path: Path, error: BaseException) -> Path:
        """Move a corrupted partition directory out of the way; returns where it went."""
        aside = path.with_name(f"{path.name}{CORRUPT_MARKER}{int(time.time() * 1000)}")
        try:
            path.rename(aside)
        except OSError as failure:
            raise StateStoreError(
                f"the state partition at {path} is damaged ({error}) but cannot be moved aside to {aside}: {failure}. "
                "Make the state directory writable, then run the worker again (or delete the partition's directory "
                "yourself: it is restored from its changelog)."
            ) from failure
        log.warning("State partition %s is corrupted (%s); moved it to %s for inspection", path, error, aside)
        self._prune_corrupt_copies(path.parent.name, int(path.name))
        return aside

    def _prune_corrupt_copies(self, store: str, partition: int) -> None:
        copies = self.corrupt_copies(store, partition)
        cutoff = time.time() - self.corrupt_retention_seconds
        keep = set(copies[-self.corrupt_copies_kept :]) if self.corrupt_copies_kept > 0 else set()
        for copy in copies:
            if copy not in keep or _copy_time(copy) < cutoff:
                shutil.rmtree(copy, ignore_errors=True)
                log.info("Deleted old corrupt copy %s", copy)


def _copy_time(path: Path) -> float:
    """When a `.corrupt-<ms>` copy was made, in seconds (0 for a name without a readable time)."""
    stamp = path.name.rpartition(CORRUPT_MARKER)[2]
    if not stamp.isdigit():
        return 0.0
    value = int(stamp)
    return value / 1000 if value > 10**11 else float(value)  # older copies were named in seconds
