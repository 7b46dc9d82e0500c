"""The processing steps of an app, declared in the style of Quix Streams' StreamingDataFrame.

Owns `Step` and `StreamingDataFrame`: `apply` maps a value, `update` runs a function for its
effect and passes the value through, `filter` drops values for which it returns false. A step is
stateful when declared so: it then receives the `State` of its store (the app's only store unless
named) as second argument. `aggregate` folds each value into a per-key aggregate
(`aggregations.Aggregator`) kept in a store of its own, and passes on the updated result. `run`
pushes one value through every step; what a step raises is a
`StepFailed` for the error policy, except a `StateStoreError` (a damaged or unwritable store),
which is the store's failure, not the message's, and passes through as it is. `tumbling_window`
and `hopping_window` declare windowed aggregations (`windows.WindowedAggregation`): their step
passes on an `Emitted` list of window results, which the stateless steps after it map one by one.
`compiled` gives the worker's hot path a function that does what `run` does, specialised for the
common one-step frame.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dagster_stateful.core.processing.aggregations import Aggregator
from dagster_stateful.core.processing.windows import (
    LATE,
    Duration,
    Emit,
    Emitted,
    WindowedAggregation,
    Windows,
    window_result,
)
from dagster_stateful.core.state.kv import State
from dagster_stateful.core.state.live import LiveState
from dagster_stateful.core.state.windows import WindowBounds, WindowState
from dagster_stateful.errors import ConfigurationError, StateStoreError

DROPPED = object()
REPLACING = frozenset({"apply", "aggregate", "window"})
"""Kinds of step whose result replaces the value."""


class StepFailed(Exception):
    """A step raised; carries which one, for the error policy's message."""

    def __init__(self, step: str, error: Exception) -> None:
        super().__init__(f"step {step!r} raised {type(error).__name__}: {error}")
        self.step = step
        self.error = error


@dataclass(frozen=True)
class Step:
    kind: str
    function: Callable[..., Any] | Aggregator
    store: str | None
    """The store a stateful step reads and writes; None for a stateless step."""
    aggregation: str | None = None
    """An aggregate step's name: the state key of its aggregates (of a window step: its name only)."""
    windows: Windows | None = None
    """A window step's windows."""
    emit: Emit = "current"
    """A window step's results: each update ("current") or each window once it closes ("final")."""

    @property
    def name(self) -> str:
        if self.aggregation is not None:
            return self.aggregation
        return str(getattr(self.function, "__name__", repr(self.function)))


Views = Mapping[str, State | LiveState | WindowState]
"""The state of each store, scoped to the current message key."""
StepCall = Callable[[Any, Views], Any]
"""(value, states by store) -> what the step returns."""


def _call_fold(step: Step, aggregator: Aggregator) -> StepCall:
    """An aggregate step as a function of (value, states): the aggregator's result after folding the
    value into its key's aggregate. Raises like `_call_step`'s functions."""
    store, name = step.store, step.name
    suffix, first, add = name.encode(), aggregator.first, aggregator.add
    result = aggregator.result if aggregator.has_result else None

    def fold(value: Any, states: Views) -> Any:
        try:
            aggregate = states[store].fold(suffix, value, first, add)  # type: ignore[index, union-attr]
            return aggregate if result is None else result(aggregate)
        except StateStoreError:
            raise
        except Exception as error:
            raise StepFailed(name, error) from error

    return fold


def _call_windowed(step: Step, aggregator: Aggregator, windows: Windows) -> StepCall:
    """A window step as a function of (value, states): the `Emitted` window results of the value, or
    `LATE`. Raises like `_call_step`'s functions."""
    store, name, size, final = step.store, step.name, windows.size, step.emit == "final"
    first, add, starts, event_time = aggregator.first, aggregator.add, windows.starts, windows.timestamp
    result = aggregator.result if aggregator.has_result else None

    def windowed(value: Any, states: Views) -> Emitted:
        try:
            state: WindowState = states[store]  # type: ignore[index, assignment]
            if event_time is not None:
                state.timestamp = _event_time(event_time(value))
            elif state.timestamp < 0:
                raise ValueError("the message has no timestamp; give the windows a timestamp= function of the value")
            updated, closed = state.update(starts(state.timestamp), value, first, add)
            if not updated:
                return LATE
            if final:
                windows_out = [(key, start, aggregate) for key, start, aggregate in closed]
            else:
                key = state.message_key
                windows_out = [(key, start, aggregate) for start, aggregate in updated]
            return Emitted(
                [
                    window_result(key, start, size, aggregate if result is None else result(aggregate))
                    for key, start, aggregate in windows_out
                ]
            )
        except StateStoreError:
            raise
        except Exception as error:
            raise StepFailed(name, error) from error

    return windowed


def _event_time(timestamp: Any) -> int:
    if timestamp.__class__ is not int or timestamp < 0:
        raise ValueError(f"the timestamp function returned {timestamp!r}; event times are ints of ms since the epoch")
    return timestamp


def _call_step(step: Step) -> StepCall:
    """The step as a function of (value, states): it raises `StepFailed` for what the step raises,
    except `StateStoreError`, which passes through."""
    function, store, name = step.function, step.store, step.name
    if isinstance(function, Aggregator):
        if step.windows is not None:
            return _call_windowed(step, function, step.windows)
        return _call_fold(step, function)

    def call(value: Any, states: Views) -> Any:
        try:
            return function(value) if store is None else function(value, states[store])
        except StateStoreError:
            raise
        except Exception as error:
            raise StepFailed(name, error) from error

    return call


class StreamingDataFrame:
    """The app's steps, in order. Methods add a step and return the same frame."""

    def __init__(
        self, store_names: list[str], expiring: frozenset[str] = frozenset(), evicting: frozenset[str] = frozenset()
    ) -> None:
        """expiring: the stores declared with a ttl (only apply, update and filter steps may use them);
        evicting: the LRU stores (windows may not use them)."""
        self._store_names = store_names
        self._expiring = expiring
        self._evicting = evicting
        self._steps: tuple[Step, ...] = ()
        self._chain: tuple[tuple[str, StepCall], ...] = ()
        """(kind, `_call_step`) per step, for `run` (one attribute lookup per message, not four per step)."""

    @property
    def steps(self) -> tuple[Step, ...]:
        """The steps, in order (add them with `apply`, `update` and `filter`)."""
        return self._steps

    @property
    def is_stateful(self) -> bool:
        return any(step.store is not None for step in self.steps)

    @property
    def aggregated_stores(self) -> frozenset[str]:
        """The stores aggregate and window steps keep their aggregates in (no other step uses them)."""
        return frozenset(step.store for step in self.steps if step.aggregation is not None and step.store)

    @property
    def live_stores(self) -> dict[str, WindowBounds | None]:
        """The aggregations' stores: None for a keyed aggregation's, the bounds of a window store's."""
        return {
            step.store: None if step.windows is None else step.windows.bounds
            for step in self.steps
            if step.aggregation is not None and step.store
        }

    @property
    def is_windowed(self) -> bool:
        return any(step.windows is not None for step in self.steps)

    def changelog_configs(self) -> dict[str, dict[str, str]]:
        """Changelog topic settings of the stores that need their own (the window stores')."""
        return {step.store: step.windows.changelog_config() for step in self.steps if step.windows and step.store}

    def apply(self, function: Callable[..., Any], *, stateful: bool = False, store: str | None = None):
        """Replace the value with `function(value)` or, stateful, `function(value, state)`."""
        return self._add("apply", function, stateful, store)

    def update(self, function: Callable[..., Any], *, stateful: bool = False, store: str | None = None):
        """Call `function` for its effect (on state, say); the value passes through unchanged."""
        return self._add("update", function, stateful, store)

    def filter(self, function: Callable[..., Any], *, stateful: bool = False, store: str | None = None):
        """Keep the value only when `function` returns true."""
        return self._add("filter", function, stateful, store)

    def aggregate(self, aggregator: Aggregator, *, store: str | None = None, name: str | None = None):
        """Fold each value into its message key's aggregate and pass on the result, as Kafka Streams'
        `groupByKey().aggregate(...)` does: `aggregator` is a `Count`, `Sum`, `Min`, `Max`, `Mean`,
        `Reduce`, `Aggregate` or an `Aggregator` of your own. The aggregate is kept in `store` (the
        app's only store unless named) under state key `name` (the aggregator's name unless given);
        that store is then the aggregations' own: no stateful apply, update or filter may use it."""
        if not isinstance(aggregator, Aggregator):
            raise TypeError(f"aggregate needs an Aggregator (Count(), Sum(...), Aggregate(...)), got {aggregator!r}")
        name = name or aggregator.name
        resolved = self._resolve_store(store)
        self._refuse_expiring(resolved, "an aggregation")
        taken = [step for step in self.steps if step.store == resolved]
        if any(step.aggregation is None for step in taken):
            raise self._shared_store(resolved)
        if any(step.aggregation == name for step in taken):
            raise ConfigurationError(
                f"store {resolved!r} already has an aggregation named {name!r}: give this one another name=..."
            )
        self._refuse_after_windows("aggregate")
        return self._append(Step("aggregate", aggregator, resolved, name))

    def tumbling_window(
        self,
        size: Duration,
        *,
        grace: Duration = 0,
        retention: Duration | None = None,
        timestamp: Callable[[Any], int] | None = None,
        store: str | None = None,
    ) -> WindowedAggregation[StreamingDataFrame]:
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
    ) -> WindowedAggregation[StreamingDataFrame]:
        """Windows of `size` starting every `step` (so a message counts in size / step of them); the
        rest as `tumbling_window`."""
        return self._windows(Windows.define(size, step, grace, retention, timestamp), store)

    def _windows(self, windows: Windows, store: str | None) -> WindowedAggregation[StreamingDataFrame]:
        self._refuse_after_windows("a windowed aggregation")
        return WindowedAggregation(self._add_windowed, windows, store)

    def _add_windowed(
        self, windows: Windows, aggregator: Aggregator, name: str, store: str | None, emit: Emit
    ) -> StreamingDataFrame:
        resolved = self._resolve_store(store)
        self._refuse_expiring(resolved, "a windowed aggregation")
        if resolved in self._evicting:
            raise ConfigurationError(
                f"store {resolved!r} is an LRU store, which would evict windows before they close: keep the windows in "
                "a store of their own (a window store expires its windows by its retention)"
            )
        if any(step.store == resolved for step in self.steps):
            raise ConfigurationError(
                f"store {resolved!r} is already used by another step; a windowed aggregation keeps its windows in a "
                "store of its own: declare another store in the app's stores and name it with store=..."
            )
        self._refuse_after_windows("a windowed aggregation")
        return self._append(Step("window", aggregator, resolved, name, windows, emit))

    def _refuse_expiring(self, store: str, what: str) -> None:
        if store in self._expiring:
            raise ConfigurationError(
                f"store {store!r} has a ttl, which {what} cannot use: a window store's windows expire by its "
                "retention, and an aggregate by key lives until deleted. Keep the aggregation in a store without a "
                "ttl (declare another store and name it with store=...)."
            )

    def _refuse_after_windows(self, what: str) -> None:
        if self.is_windowed:
            raise ConfigurationError(
                f"{what} cannot follow a windowed aggregation: its results belong to windows, not to the message's "
                "key. After a windowed aggregation only stateless apply, update and filter steps may come."
            )

    def _add(self, kind: str, function: Callable[..., Any], stateful: bool, store: str | None):
        if not callable(function):
            raise TypeError(f"{kind} needs a callable, got {function!r}")
        if store is not None:
            stateful = True
        resolved = self._resolve_store(store) if stateful else None
        if resolved is not None and resolved in self.aggregated_stores:
            raise self._shared_store(resolved)
        if resolved is not None:
            self._refuse_after_windows(f"a stateful {kind}")
        return self._append(Step(kind, function, resolved))

    def _append(self, step: Step):
        self._steps += (step,)
        self._chain += ((step.kind, _call_step(step)),)
        return self

    @staticmethod
    def _shared_store(store: str) -> ConfigurationError:
        return ConfigurationError(
            f"store {store!r} would hold both aggregates and the state of an apply, update or filter step; "
            "an aggregation keeps its aggregates as live objects between commits, so it needs a store of its own: "
            "declare another store in the app's stores and name it with store=..."
        )

    def _resolve_store(self, store: str | None) -> str:
        if store is None:
            if len(self._store_names) != 1:
                raise ConfigurationError(
                    f"this app has stores {self._store_names}: name the one this stateful step uses with store=..."
                )
            return self._store_names[0]
        if store not in self._store_names:
            raise ConfigurationError(f"unknown store {store!r}; the app declares {self._store_names}")
        return store

    def compiled(self) -> StepCall:
        """A function doing what `run` does; for a frame of one `apply` or `update` step, without
        the loop over the steps (call it again after adding steps)."""
        if len(self._chain) != 1 or self._chain[0][0] == "filter":
            return self.run
        kind, call = self._chain[0]
        if kind in REPLACING:
            return call

        def update_one(value: Any, states: Views) -> Any:
            call(value, states)
            return value

        return update_one

    def run(self, value: Any, states: Views) -> Any:
        """The value after every step, or DROPPED when a filter dropped it; after a window step, the
        `Emitted` window results, each through the steps that follow it."""
        chain = self._chain
        for index, (kind, call) in enumerate(chain):
            result = call(value, states)
            if kind == "window":
                return _through(result, chain[index + 1 :], states)
            if kind in REPLACING:
                value = result
            elif kind == "filter" and not result:
                return DROPPED
        return value


def _through(emitted: Emitted, chain: tuple[tuple[str, StepCall], ...], states: Views) -> Emitted:
    """Window results, each through the (stateless) steps of `chain`."""
    if emitted.late or not chain:
        return emitted
    out = Emitted()
    for key, value in emitted:
        for kind, call in chain:
            result = call(value, states)
            if kind in REPLACING:
                value = result
            elif kind == "filter" and not result:
                break
        else:
            out.append((key, value))
    return out
