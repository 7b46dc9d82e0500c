"""Windowed aggregations: what `StreamingDataFrame.tumbling_window` and `hopping_window` declare.

Owns `Windows` (a window definition: size, step, grace, retention and the event time of a value;
which windows a timestamp falls in), `WindowedAggregation` (the builder: `aggregate(aggregator)`
then `current()` or `final()`), the results a window step passes on (`Emitted`, a list of
(message key, `{"start", "end", "value"}`), and `LATE` for a message whose windows have all
closed) and the changelog topic settings of a window store.

Event time is the message's timestamp (ms) unless the definition says `timestamp=` (a function of
the value returning ms). Windows are aligned to the epoch, as in Kafka Streams and Quix Streams: a
tumbling window of size S covers [k*S, (k+1)*S); a hopping one of size S and step H covers
[k*H, k*H + S). `current()` passes on each window the message updated, with its aggregate so far;
`final()` passes on each window once, when it closes (stream time past its end plus grace), for
whichever message key it belongs to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from dagster_stateful.core.processing.dsl.aggregations import Aggregator
from dagster_stateful.core.state.stores import Duration, as_ms
from dagster_stateful.core.state.window_state import WindowBounds
from dagster_stateful.errors import ConfigurationError

__all__ = ["LATE", "Emitted", "WindowedAggregation", "Windows", "as_ms"]

Emit = Literal["current", "final"]
Frame = TypeVar("Frame")

CHANGELOG_EXTRA_RETENTION_MS = 24 * 3600 * 1000
"""How much longer than the store the changelog of a window store keeps records (Kafka Streams'
windowstore.changelog.additional.retention.ms): wall-clock time, not event time, so a margin."""


class Emitted(list[tuple[bytes, Any]]):
    """What a window step passes on: (message key, result) per window, in order."""

    __slots__ = ("late",)

    def __init__(self, items: list[tuple[bytes, Any]] | None = None, late: bool = False) -> None:
        super().__init__(items or ())
        self.late = late
        """Every window of the message had closed: it changed nothing."""


LATE = Emitted(late=True)
"""The result of a message that arrived after all of its windows closed."""


@dataclass(frozen=True)
class Windows:
    """Windows of `size` ms starting every `step` ms (tumbling: step == size)."""

    size: int
    step: int
    grace: int
    retention: int
    timestamp: Callable[[Any], int] | None = None
    """The event time (ms) of a value; None: the message's timestamp."""

    @classmethod
    def define(
        cls,
        size: Duration,
        step: Duration | None,
        grace: Duration,
        retention: Duration | None,
        timestamp: Callable[[Any], int] | None,
    ) -> Windows:
        size_ms = as_ms(size, "the window size")
        step_ms = size_ms if step is None else as_ms(step, "the window step")
        grace_ms = as_ms(grace, "the grace period")
        if size_ms <= 0 or step_ms <= 0 or grace_ms < 0:
            raise ConfigurationError(
                f"windows need a positive size and step and a grace period of 0 or more "
                f"(got size {size_ms} ms, step {step_ms} ms, grace {grace_ms} ms)"
            )
        if step_ms > size_ms:
            raise ConfigurationError(
                f"a hopping window's step ({step_ms} ms) cannot exceed its size ({size_ms} ms): messages between "
                "windows would belong to none"
            )
        least = size_ms + grace_ms
        retention_ms = least if retention is None else as_ms(retention, "the retention period")
        if retention_ms < least:
            raise ConfigurationError(
                f"the retention period ({retention_ms} ms) must be at least the window size plus grace ({least} ms): "
                "a window would be deleted before it closes. Raise retention, or leave it out for size + grace."
            )
        if timestamp is not None and not callable(timestamp):
            raise ConfigurationError(f"timestamp must be a function of the value returning ms, got {timestamp!r}")
        return cls(size_ms, step_ms, grace_ms, retention_ms, timestamp)

    @property
    def bounds(self) -> WindowBounds:
        return WindowBounds(self.size, self.grace, self.retention)

    @property
    def kind(self) -> str:
        return "tumbling" if self.step == self.size else "hopping"

    def starts(self, timestamp: int) -> list[int]:
        """Starts of the windows `timestamp` falls in, oldest first (none start before 0)."""
        size, step = self.size, self.step
        last = timestamp - timestamp % step
        if step == size:
            return [last]
        first = max(0, last - ((size - 1) // step) * step)
        while first + size <= timestamp:
            first += step
        return list(range(first, last + 1, step))

    def changelog_config(self) -> dict[str, str]:
        return window_changelog_config(self.retention)


def window_changelog_config(retention: int) -> dict[str, str]:
    """Topic settings of a window or session store's changelog: compacted, and deleted once expired."""
    return {"cleanup.policy": "compact,delete", "retention.ms": str(retention + CHANGELOG_EXTRA_RETENTION_MS)}


AddStep = Callable[[Any, Aggregator, str, str | None, Emit, int | None], Frame]
"""(windows or sessions, aggregator, name, store, emit, idleness in ms) -> the frame with the window
step added."""


class WindowedAggregation(Generic[Frame]):
    """A window (or session) definition waiting for its aggregation and how results are emitted."""

    def __init__(self, add_step: AddStep[Frame], windows: Any, store: str | None) -> None:
        self._add_step = add_step
        self._windows = windows
        self._store = store
        self._aggregator: Aggregator | None = None
        self._name: str | None = None

    def aggregate(self, aggregator: Aggregator, *, name: str | None = None) -> WindowedAggregation[Frame]:
        """Fold each value into its key's windows with `aggregator` (`Count()`, `Sum(...)`, ...);
        then say `current()` or `final()`."""
        if not isinstance(aggregator, Aggregator):
            raise TypeError(f"aggregate needs an Aggregator (Count(), Sum(...), Aggregate(...)), got {aggregator!r}")
        self._aggregator = aggregator
        self._name = name or aggregator.name
        return self

    def current(self) -> Frame:
        """Pass on every window the message updated, with its aggregate so far."""
        return self._add("current", None)

    def final(self, *, advance_when_idle: Duration | None = None) -> Frame:
        """Pass on each window once, when it closes. `advance_when_idle`: once a partition has had no
        record for this long (wall-clock time), its stream time moves on with the wall clock from
        the last one's, so its windows close and are sent although no record comes to move it
        (see `paths.idle_windows`)."""
        idle_ms = None
        if advance_when_idle is not None:
            idle_ms = as_ms(advance_when_idle, "advance_when_idle")
            if idle_ms <= 0:
                raise ConfigurationError(f"advance_when_idle must be a positive duration, got {advance_when_idle!r}")
        return self._add("final", idle_ms)

    def _add(self, emit: Emit, idle_ms: int | None) -> Frame:
        if self._aggregator is None or self._name is None:
            raise ConfigurationError("say what the windows aggregate first: .aggregate(Count()).final(), say")
        return self._add_step(self._windows, self._aggregator, self._name, self._store, emit, idle_ms)


def window_result(key: bytes, start: int, size: int, value: Any) -> tuple[bytes, dict[str, Any]]:
    """What flows downstream for one window."""
    return key, {"start": start, "end": start + size, "value": value}
