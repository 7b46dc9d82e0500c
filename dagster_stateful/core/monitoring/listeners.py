"""Restore and state listeners, as Kafka Streams users know them.

Owns the `AppState` lifecycle (CREATED -> REBALANCING -> RUNNING -> PENDING_SHUTDOWN ->
NOT_RUNNING, or ERROR), the `RestoreListener` callbacks (start / batch / end of each store
partition's restore) and `Listeners`, which calls them and logs, rather than propagates, a
listener's own failure so that observing a worker can never break it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import StrEnum

log = logging.getLogger(__name__)


class AppState(StrEnum):
    CREATED = "CREATED"
    REBALANCING = "REBALANCING"
    RUNNING = "RUNNING"
    PENDING_SHUTDOWN = "PENDING_SHUTDOWN"
    NOT_RUNNING = "NOT_RUNNING"
    ERROR = "ERROR"


StateListener = Callable[[AppState, AppState], None]
"""Called with (new_state, old_state) on every transition."""


class RestoreListener:
    """Override the callbacks you need; offsets are changelog offsets."""

    def on_restore_start(self, partition: int, store: str, start_offset: int, end_offset: int) -> None: ...

    def on_batch_restored(self, partition: int, store: str, batch_end_offset: int, num_restored: int) -> None: ...

    def on_restore_end(self, partition: int, store: str, total_restored: int) -> None: ...

    def on_restore_suspended(self, partition: int, store: str, total_restored: int) -> None:
        """The restore stopped before the end (revocation, shutdown); its progress is kept."""


class Listeners:
    def __init__(self) -> None:
        self.restore: list[RestoreListener] = []
        self.state: list[StateListener] = []
        self.current = AppState.CREATED

    def copy(self) -> Listeners:
        """Listeners with the same callbacks, to which more can be added without changing these."""
        copied = Listeners()
        copied.restore, copied.state, copied.current = list(self.restore), list(self.state), self.current
        return copied

    def transition(self, new: AppState) -> None:
        old, self.current = self.current, new
        if old is new:
            return
        log.info("App state %s -> %s", old.value, new.value)
        for listener in self.state:
            self._call(listener, new, old)

    def restore_start(self, partition: int, store: str, start: int, end: int) -> None:
        for listener in self.restore:
            self._call(listener.on_restore_start, partition, store, start, end)

    def batch_restored(self, partition: int, store: str, batch_end: int, count: int) -> None:
        for listener in self.restore:
            self._call(listener.on_batch_restored, partition, store, batch_end, count)

    def restore_end(self, partition: int, store: str, total: int) -> None:
        for listener in self.restore:
            self._call(listener.on_restore_end, partition, store, total)

    def restore_suspended(self, partition: int, store: str, total: int) -> None:
        for listener in self.restore:
            self._call(listener.on_restore_suspended, partition, store, total)

    @staticmethod
    def _call(callback: Callable[..., None], *args: object) -> None:
        try:
            callback(*args)
        except Exception:
            log.exception("Listener %r failed", callback)
