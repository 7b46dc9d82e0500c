"""Session windows: what `StreamingDataFrame.session_window` declares.

Owns `Sessions` (a session definition: inactivity gap, grace, retention and the event time of a
value) and `session_result`, what flows downstream for one session. A key's session grows with
each record less than the gap after (or before) it, and merges with the next when a record bridges
the two (see `state.session_state`). `current()` passes on the session each message updated, with
its aggregate so far and the starts of the sessions it absorbed under another start (`merged`:
drop those rows downstream); `final()` passes on each session once, when it closes: stream time
past its end plus gap plus grace, after which no record still on time can reach it.

Kafka Streams takes a record as late only when its merged session ends before stream time minus
grace and gap, and may then re-open (and emit again) a session already emitted as final; here a
record more than the grace behind stream time is late, so that a final session is final.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dagster_stateful.core.processing.dsl.aggregations import Aggregator
from dagster_stateful.core.processing.dsl.windows import window_changelog_config
from dagster_stateful.core.state.session_state import SessionBounds
from dagster_stateful.core.state.stores import Duration, as_ms
from dagster_stateful.errors import ConfigurationError

__all__ = ["Sessions", "session_result"]


@dataclass(frozen=True)
class Sessions:
    """Sessions of activity per key, closed after `gap` ms without a record (plus `grace`)."""

    gap: int
    grace: int
    retention: int
    timestamp: Callable[[Any], int] | None = None
    """The event time (ms) of a value; None: the message's timestamp."""

    kind = "session"

    @classmethod
    def define(
        cls, gap: Duration, grace: Duration, retention: Duration | None, timestamp: Callable[[Any], int] | None
    ) -> Sessions:
        gap_ms = as_ms(gap, "the inactivity gap")
        grace_ms = as_ms(grace, "the grace period")
        if gap_ms <= 0 or grace_ms < 0:
            raise ConfigurationError(
                f"session windows need a positive inactivity gap and a grace period of 0 or more "
                f"(got gap {gap_ms} ms, grace {grace_ms} ms)"
            )
        least = gap_ms + grace_ms
        retention_ms = least if retention is None else as_ms(retention, "the retention period")
        if retention_ms < least:
            raise ConfigurationError(
                f"the retention period ({retention_ms} ms) must be at least the inactivity gap plus grace "
                f"({least} ms): "
                "a session would be deleted before it closes, and a record after it would start a new one where it "
                "should have extended it. Raise retention, or leave it out for gap + grace."
            )
        if timestamp is not None and not callable(timestamp):
            raise ConfigurationError(f"timestamp must be a function of the value returning ms, got {timestamp!r}")
        return cls(gap_ms, grace_ms, retention_ms, timestamp)

    @staticmethod
    def check(aggregator: Aggregator) -> None:
        """Refuse an aggregator that cannot combine the aggregates of two sessions a record bridges."""
        if not aggregator.combinable:
            raise ConfigurationError(
                f"session windows merge the sessions a record bridges, which {type(aggregator).__name__} cannot: "
                "use a columnar aggregator, Collect or Reduce, or give Aggregate a merger=(earlier, later) -> aggregate"
            )

    @property
    def bounds(self) -> SessionBounds:
        return SessionBounds(self.gap, self.grace, self.retention)

    def changelog_config(self) -> dict[str, str]:
        return window_changelog_config(self.retention)


def session_result(
    key: bytes, start: int, end: int, value: Any, merged: list[int] | None = None
) -> tuple[bytes, dict[str, Any]]:
    """What flows downstream for one session (a `current()` update also says which it `merged`)."""
    if merged is None:
        return key, {"start": start, "end": end, "value": value}
    return key, {"start": start, "end": end, "value": value, "merged": merged}
