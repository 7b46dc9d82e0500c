"""The window declarations of `StreamingDataFrame`: tumbling, hopping, sliding and session windows.

Owns `WindowDeclarations`, the mixin `StreamingDataFrame` takes them from: each makes a
`windows.WindowedAggregation` of a `windows.Windows`, `sliding.SlidingWindows` or
`sessions.Sessions` definition, which adds
its step to the frame (`_add_windowed`) once told what it aggregates and when it emits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Self

from dagster_stateful.core.processing.dsl.aggregations import Aggregator
from dagster_stateful.core.processing.dsl.sessions import Sessions
from dagster_stateful.core.processing.dsl.sliding import SlidingWindows
from dagster_stateful.core.processing.dsl.windows import Duration, Emit, WindowedAggregation, Windows

__all__ = ["AnyWindows", "WindowDeclarations"]

AnyWindows = Windows | SlidingWindows | Sessions
"""A window step's definition: time windows, sliding windows or sessions."""


class WindowDeclarations:
    """Window declarations, for a frame that refuses them where they cannot come and adds their step."""

    def tumbling_window(
        self,
        size: Duration,
        *,
        grace: Duration = 0,
        retention: Duration | None = None,
        timestamp: Callable[[Any], int] | None = None,
        store: str | None = None,
    ) -> WindowedAggregation[Self]:
        """Windows of `size` one after the other (timedelta, or int ms), over event time: the message's
        timestamp, or `timestamp(value)` in ms. A message up to `grace` behind stream time (the
        latest event time its partition has seen) still counts in its window; later, it is late
        (counted, logged, or dead-lettered under on_error="dead-letter"). Windows are kept in
        `store` (the app's only store unless named; no other step may use it) for `retention`
        (default and least: size + grace), then deleted and tombstoned in the changelog. Continue
        with `.aggregate(Count()).final()` (say)."""
        return self._windows(Windows.define(size, None, grace, retention, timestamp), store)

    def hopping_window(
        self,
        size: Duration,
        step: Duration,
        *,
        grace: Duration = 0,
        retention: Duration | None = None,
        timestamp: Callable[[Any], int] | None = None,
        store: str | None = None,
    ) -> WindowedAggregation[Self]:
        """Windows of `size` starting every `step` (so a message counts in size / step of them); the
        rest as `tumbling_window`."""
        return self._windows(Windows.define(size, step, grace, retention, timestamp), store)

    def sliding_window(
        self,
        difference: Duration,
        *,
        grace: Duration = 0,
        retention: Duration | None = None,
        timestamp: Callable[[Any], int] | None = None,
        store: str | None = None,
    ) -> WindowedAggregation[Self]:
        """Sliding windows (Kafka Streams' `SlidingWindows.ofTimeDifferenceAndGrace`, see
        `sliding.SlidingWindows`): per key, a window [start, start + difference] (both ends
        inclusive) for every distinct set of records no more than `difference` apart. A window closes
        once stream time passes its end plus `grace`; a record is late once every window it could
        fall in has closed. Windows are kept `retention` after their start (default and least:
        difference + grace + 1 ms), with the records that new windows are folded from. Continue with
        `.aggregate(Sum("amount")).current()` (say)."""
        return self._windows(SlidingWindows.define(difference, grace, retention, timestamp), store)

    def session_window(
        self,
        gap: Duration,
        *,
        grace: Duration = 0,
        retention: Duration | None = None,
        timestamp: Callable[[Any], int] | None = None,
        store: str | None = None,
    ) -> WindowedAggregation[Self]:
        """Sessions of activity per key (Kafka Streams' `SessionWindows`, see `sessions.Sessions`): a
        message more than `grace` behind stream time is late; a session closes once stream time
        passes its end plus `gap` plus grace, and is kept `retention` after its end (default and
        least: gap + grace). Continue with `.aggregate(Count()).final()` (say)."""
        return self._windows(Sessions.define(gap, grace, retention, timestamp), store)

    def _windows(self, windows: AnyWindows, store: str | None) -> WindowedAggregation[Self]:
        self._refuse_after_windows("a windowed aggregation")
        self._refuse_after_per_commit("a windowed aggregation")
        return WindowedAggregation(self._add_windowed, windows, store)

    def _refuse_after_windows(self, what: str) -> None:
        raise NotImplementedError

    def _refuse_after_per_commit(self, what: str) -> None:
        raise NotImplementedError

    def _add_windowed(
        self,
        windows: AnyWindows,
        aggregator: Aggregator,
        name: str,
        store: str | None,
        emit: Emit,
        idle_ms: int | None = None,
    ) -> Self:
        raise NotImplementedError
