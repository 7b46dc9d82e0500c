"""A bounded run's limits, its deadline, and how it is asked to stop.

Owns `RunLimits` (until caught up, after N messages, after T seconds, whichever first, and the
grace a run bounded in time has past its `max_seconds` to commit and close), `Deadline` (the
moment a blocking Kafka call must have returned by; a run bounded in time has two: commits give up
`CLOSE_RESERVE_SECONDS` before its end, so that closing the clients still fits in the grace) and
`StopSignal` (set by SIGTERM when the worker runs on the main thread, or by `request()` from
another thread; the worker checks it between batches and between restore steps).
"""

from __future__ import annotations

import math
import signal
import threading
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

from dagster_stateful.errors import ConfigurationError

SHUTDOWN_GRACE_SECONDS = 30.0
"""How long past `max_seconds` a bounded worker may take to finish: its last commit (or giving it
up) and closing its clients. Every blocking Kafka call of the run returns by then."""
CLOSE_RESERVE_SECONDS = 5.0
"""The end of the grace kept for closing the clients: commits give up this much before the end
(at most a third of the grace)."""
CLOSE_TIMEOUT_SECONDS = 30.0
"""How long closing one client may take in a run without `max_seconds`."""


class Deadline:
    """When a run's blocking calls must have returned; `Deadline(None)` never passes."""

    def __init__(self, at: float | None) -> None:
        """at: a `time.monotonic()` moment, or None for no deadline."""
        self.at = at

    def left(self) -> float:
        """Seconds until the deadline (negative once it passed; infinite without one)."""
        return math.inf if self.at is None else self.at - time.monotonic()

    def passed(self) -> bool:
        return self.left() <= 0

    def bound(self, seconds: float) -> float:
        """`seconds`, or the time left when that is shorter (never below 0)."""
        return max(0.0, min(seconds, self.left()))


@dataclass(frozen=True)
class RunLimits:
    max_messages: int | None = None
    max_seconds: float | None = None
    until_caught_up: bool = True
    grace_seconds: float = SHUTDOWN_GRACE_SECONDS
    """How long past `max_seconds` the run may take to commit and close (see `SHUTDOWN_GRACE_SECONDS`)."""

    def __post_init__(self) -> None:
        if not self.grace_seconds > 0:
            raise ConfigurationError(f"grace_seconds must be positive, got {self.grace_seconds!r}")

    def deadlines(self, started: float) -> tuple[Deadline, Deadline]:
        """(commits', run's end) of a run that started at `started` (`time.monotonic()`); neither
        passes when the run has no `max_seconds`."""
        if self.max_seconds is None:
            return Deadline(None), Deadline(None)
        end = started + self.max_seconds + self.grace_seconds
        return Deadline(end - min(CLOSE_RESERVE_SECONDS, self.grace_seconds / 3)), Deadline(end)


class StopSignal:
    """Set by SIGTERM (when the worker runs on the main thread) or by `request()`."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def request(self, signum: int | None = None, frame: FrameType | None = None) -> None:
        self.requested = True

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self.request)

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
