"""Sliding windows: what `StreamingDataFrame.sliding_window` declares.

Owns `SlidingWindows` (a definition: the time difference, grace, retention and the event time of a
value), Kafka Streams' `SlidingWindows.ofTimeDifferenceAndGrace`: windows [start, start + d], both
ends inclusive, one ending at each record and one starting just after each record that a later
record of its key lies within d of, so that every distinct set of a key's records no more than d
apart has a window (see `state.sliding_state`). `current()` passes on each window the record
changed or made, with its aggregate so far; `final()` each window once, when stream time passes
its end plus the grace. A record is late only once every window it could fall in has closed, as
in Kafka Streams: one a little later than that still counts in the windows still open.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dagster_stateful.core.processing.dsl.windows import window_changelog_config
from dagster_stateful.core.state.sliding_state import SlidingBounds
from dagster_stateful.core.state.stores import Duration, as_ms
from dagster_stateful.errors import ConfigurationError

__all__ = ["SlidingWindows"]


@dataclass(frozen=True)
class SlidingWindows:
    """Windows of a time difference of `difference` ms between their first and last record."""

    difference: int
    grace: int
    retention: int
    timestamp: Callable[[Any], int] | None = None
    """The event time (ms) of a value; None: the message's timestamp."""

    kind = "sliding"

    @classmethod
    def define(
        cls, difference: Duration, grace: Duration, retention: Duration | None, timestamp: Callable[[Any], int] | None
    ) -> SlidingWindows:
        difference_ms = as_ms(difference, "the time difference")
        grace_ms = as_ms(grace, "the grace period")
        if difference_ms <= 0 or grace_ms < 0:
            raise ConfigurationError(
                f"sliding windows need a positive time difference and a grace period of 0 or more "
                f"(got difference {difference_ms} ms, grace {grace_ms} ms)"
            )
        least = difference_ms + grace_ms + 1
        retention_ms = least if retention is None else as_ms(retention, "the retention period")
        if retention_ms < least:
            raise ConfigurationError(
                f"the retention period ({retention_ms} ms) must be more than the time difference plus grace "
                f"({least - 1} ms): a window would be deleted before it closes. Raise retention, or leave it out for "
                "difference + grace + 1 ms."
            )
        if timestamp is not None and not callable(timestamp):
            raise ConfigurationError(f"timestamp must be a function of the value returning ms, got {timestamp!r}")
        return cls(difference_ms, grace_ms, retention_ms, timestamp)

    @property
    def size(self) -> int:
        """What a window result's end is past its start (its end is inclusive)."""
        return self.difference

    @property
    def bounds(self) -> SlidingBounds:
        return SlidingBounds(self.difference, self.grace, self.retention)

    def changelog_config(self) -> dict[str, str]:
        return window_changelog_config(self.retention)
