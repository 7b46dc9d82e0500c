"""A bounded run's limits and how it is asked to stop.

Owns `RunLimits` (until caught up, after N messages, after T seconds, whichever first) and
`StopSignal` (set by SIGTERM when the worker runs on the main thread, or by `request()` from
another thread; the worker checks it between batches and between restore steps).
"""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass
from types import FrameType
from typing import Any


@dataclass(frozen=True)
class RunLimits:
    max_messages: int | None = None
    max_seconds: float | None = None
    until_caught_up: bool = True


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
