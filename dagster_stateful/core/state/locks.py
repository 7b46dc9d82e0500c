"""File locks that keep two processes (or two workers in one process) off the same state.

Owns `PartitionLock` (exclusive: one opener per store partition; the file records the holder's
pid so the refusal can name it) and `AppActivityLock` (shared by every running worker of an app,
taken exclusively by `clear_state` so state is never deleted under a running worker). Locks are
`flock`s: the kernel drops them when the holder dies, so a crashed worker never leaves a stale lock.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from dagster_stateful.errors import StateLockedError


class PartitionLock:
    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what
        self._handle: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(handle, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(handle)
            raise StateLockedError(
                f"{self.what} at {self.path.parent} is locked by another worker (pid {holder}); "
                "two workers must never open the same partition. Stop that worker, or give this one "
                "another state_dir."
            ) from None
        os.ftruncate(handle, 0)
        os.pwrite(handle, str(os.getpid()).encode(), 0)
        self._handle = handle

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            os.close(self._handle)
            self._handle = None


class AppActivityLock:
    """Held shared by running workers; `exclusive()` succeeds only when none runs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: int | None = None

    def hold_shared(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._handle, fcntl.LOCK_SH)

    def try_exclusive(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            os.close(self._handle)
            self._handle = None
            return False

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            os.close(self._handle)
            self._handle = None
