"""File locks that keep two processes (or two workers in one process) off the same state.

Owns `PartitionLock` (exclusive: one opener per store partition; the file records the holder's
pid so the refusal can name it; an opener waits, backing off, up to a bound for a holder that is
handing the partition over, then fails with `StateLockedError`) and `AppActivityLock` (shared by
every running worker of an app, taken exclusively by `clear_state` so state is never deleted under
a running worker). Locks are `flock`s: the kernel drops them when the holder dies, so a crashed
worker never leaves a stale lock.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from pathlib import Path
from typing import NoReturn

from dagster_stateful.errors import StateLockedError, StateStoreError

log = logging.getLogger(__name__)

DEFAULT_LOCK_TIMEOUT_SECONDS = 30.0
"""How long an opener waits for a partition's previous owner (a worker closing it on revocation)."""
_FIRST_RETRY_SECONDS = 0.05
_MAX_RETRY_SECONDS = 1.0


class PartitionLock:
    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what
        self._handle: int | None = None

    def acquire(self, timeout: float = 0.0) -> None:
        """Take the lock, retrying with back-off for up to `timeout` seconds (0: one try)."""
        handle = _open_lock_file(self.path, self.what)
        deadline = time.monotonic() + timeout
        delay = _FIRST_RETRY_SECONDS
        while not _try_lock(handle):
            left = deadline - time.monotonic()
            if left <= 0:
                self._refuse(handle, timeout)
            if delay == _FIRST_RETRY_SECONDS:
                log.info(
                    "Waiting up to %.0f s for pid %s to release %s at %s",
                    timeout,
                    _holder(handle),
                    self.what,
                    self.path,
                )
            time.sleep(min(delay, left))
            delay = min(2 * delay, _MAX_RETRY_SECONDS)
        os.ftruncate(handle, 0)
        os.pwrite(handle, str(os.getpid()).encode(), 0)
        self._handle = handle

    def _refuse(self, handle: int, waited: float) -> NoReturn:
        holder = _holder(handle)
        os.close(handle)
        raise StateLockedError(
            f"{self.what} at {self.path.parent} is locked by another worker (pid {holder}, lock file {self.path})"
            f"{f' and was not released within {waited:g} s' if waited > 0 else ''}; two workers must never open "
            "the same partition. If that worker is handing the partition over, retry; otherwise stop it, or give "
            "this one another state_dir."
        )

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            os.close(self._handle)
            self._handle = None


def _open_lock_file(path: Path, what: str) -> int:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise StateStoreError(
            f"cannot open the lock file of {what} at {path}: {error}. Make the state directory writable by the "
            "worker's user (and check free disk space), then run the worker again; nothing was changed."
        ) from error


def _try_lock(handle: int) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _holder(handle: int) -> str:
    """The pid the current holder wrote into the lock file."""
    return os.pread(handle, 32, 0).decode(errors="replace").strip() or "unknown"


class AppActivityLock:
    """Held shared by running workers; `exclusive()` succeeds only when none runs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: int | None = None

    def hold_shared(self) -> None:
        self._handle = _open_lock_file(self.path, "the app's state")
        fcntl.flock(self._handle, fcntl.LOCK_SH)

    def try_exclusive(self) -> bool:
        self._handle = _open_lock_file(self.path, "the app's state")
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
