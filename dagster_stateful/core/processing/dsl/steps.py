"""How each declared step runs: the functions of (value, states) the worker's hot path calls.

Owns `Step` (a declared step), `StepFailed` (what a step raised, for the error policy) and the
callables `step_call` makes of steps: an apply, update or filter calls the user's function; an
aggregate step folds the value into its key's aggregate (`LiveState.fold`), and passes on its
result, or DROPPED when it emits per commit; a window step updates the key's windows and passes on
the `Emitted` window results (or `LATE`). What a step raises becomes `StepFailed`, except a
`StateStoreError` (a damaged or unwritable store: the store's failure, not the message's), which
passes through as it is. Also `CommitEmission`, what an aggregation emitting per commit sends, and
`through`, window results run through the stateless steps after the window.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, Protocol

from dagster_stateful.core.processing.dsl.aggregations import Aggregator
from dagster_stateful.core.processing.dsl.sessions import Sessions, session_result
from dagster_stateful.core.processing.dsl.sliding import SlidingWindows
from dagster_stateful.core.processing.dsl.windows import LATE, Emit, Emitted, Windows, window_result
from dagster_stateful.core.state.kv import State
from dagster_stateful.core.state.live import LiveState
from dagster_stateful.core.state.session_state import SessionState
from dagster_stateful.core.state.sliding_state import SlidingState
from dagster_stateful.core.state.table_join_state import ENDED
from dagster_stateful.core.state.window_state import WindowBounds, WindowState
from dagster_stateful.errors import StateStoreError

DROPPED = object()


class StepKind(StrEnum):
    """What a step does with the value it is given: the one place a new operator says so."""

    APPLY = "apply"
    """Its result replaces the value."""
    UPDATE = "update"
    """Called for its effect; the value passes on unchanged."""
    FILTER = "filter"
    """The value passes on while its result is true."""
    AGGREGATE = "aggregate"
    """Folds the value into its key's aggregate and passes on the aggregate's result."""
    FOLD = "fold"
    """An aggregation emitting per commit: nothing passes on now; its results flow at the commit."""
    WINDOW = "window"
    """Updates the key's windows and passes on the `Emitted` window results, each through the steps
    after it."""
    JOIN = "join"
    """Its result (the value merged with a table's) replaces the value; DROPPED (an inner join's
    miss) drops it."""


REPLACING = frozenset({StepKind.APPLY, StepKind.AGGREGATE, StepKind.WINDOW, StepKind.FOLD})
"""Kinds of step whose result replaces the value (a fold's result is always DROPPED)."""
Chain = tuple[tuple[StepKind, "StepCall"], ...]
"""Steps as the hot path runs them: each one's kind and call."""

AggregateEmit = Literal["per-commit", "per-message"]
"""When an aggregation passes its results on: each changed key's latest once per commit (Kafka
Streams' record cache), or after every message."""


class StepFailed(Exception):
    """A step raised; carries which one, for the error policy's message."""

    def __init__(self, step: str, error: Exception) -> None:
        super().__init__(f"step {step!r} raised {type(error).__name__}: {error}")
        self.step = step
        self.error = error


class OwnWindows(Protocol):
    """The definition of a window step that makes its own call (an interval join's, `interval_joins`)."""

    kind: str

    @property
    def size(self) -> int: ...

    @property
    def bounds(self) -> WindowBounds: ...

    def changelog_config(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class Step:
    kind: StepKind
    function: Callable[..., Any] | Aggregator
    store: str | None
    """The store a stateful step reads and writes; None for a stateless step."""
    aggregation: str | None = None
    """An aggregate step's name: the state key of its aggregates (of a window step: its name only)."""
    windows: Windows | SlidingWindows | Sessions | OwnWindows | None = None
    """A window step's windows (or sliding windows, sessions, or an interval join's reach)."""
    emit: Emit = "current"
    """A window step's results: each update ("current") or each window once it closes ("final")."""
    per_commit: bool = False
    """An aggregate step's results are passed on once per key and commit, not per message."""
    idle_ms: int | None = None
    """A `final()` window step's idleness: its partition's stream time follows the wall clock once it
    has had no record for this long (None: only records move it)."""

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
    value into its key's aggregate (DROPPED when it emits per commit). Raises like `_call_step`'s functions."""
    store, name, per_commit = step.store, step.name, step.per_commit
    suffix, first, add = name.encode(), aggregator.first, aggregator.add
    result = aggregator.result if aggregator.has_result else None

    def fold(value: Any, states: Views) -> Any:
        try:
            aggregate = states[store].fold(suffix, value, first, add)  # type: ignore[index, union-attr]
        except StateStoreError:
            raise
        except Exception as error:
            raise StepFailed(name, error) from error
        if per_commit:
            return DROPPED
        try:
            return aggregate if result is None else result(aggregate)
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
            return window_results(windows_out, size, result)
        except StateStoreError:
            raise
        except Exception as error:
            raise StepFailed(name, error) from error

    return windowed


def _call_sessions(step: Step, aggregator: Aggregator, sessions: Sessions) -> StepCall:
    """A session window step as a function of (value, states): the `Emitted` session results of the
    value, or `LATE`. Raises like `_call_step`'s functions."""
    store, name, final = step.store, step.name, step.emit == "final"
    first, add, combine, event_time = aggregator.first, aggregator.add, aggregator.combine, sessions.timestamp
    result = aggregator.result if aggregator.has_result else _same

    def sessioned(value: Any, states: Views) -> Emitted:
        try:
            state: SessionState = states[store]  # type: ignore[index, assignment]
            if event_time is not None:
                state.timestamp = _event_time(event_time(value))
            elif state.timestamp < 0:
                raise ValueError("the message has no timestamp; give the sessions a timestamp= function of the value")
            updated, merged, closed = state.update_session(value, first, add, combine)
            if updated is None:
                return LATE
            if final:
                return Emitted([session_result(key, start, end, result(agg)) for key, start, end, agg in closed])
            start, end, aggregate = updated
            return Emitted([session_result(state.message_key, start, end, result(aggregate), merged)])
        except StateStoreError:
            raise
        except Exception as error:
            raise StepFailed(name, error) from error

    return sessioned


def _call_sliding(step: Step, aggregator: Aggregator, sliding: SlidingWindows) -> StepCall:
    """A sliding window step as a function of (value, states): the `Emitted` results of the windows
    the value changed or made (`current()`) or of those that closed (`final()`), or `LATE`. Raises
    like `_call_step`'s functions."""
    store, name, size, final = step.store, step.name, sliding.size, step.emit == "final"
    first, add, event_time = aggregator.first, aggregator.add, sliding.timestamp
    result = aggregator.result if aggregator.has_result else None

    def slid(value: Any, states: Views) -> Emitted:
        try:
            state: SlidingState = states[store]  # type: ignore[index, assignment]
            if event_time is not None:
                state.timestamp = _event_time(event_time(value))
            elif state.timestamp < 0:
                raise ValueError("the message has no timestamp; give the windows a timestamp= function of the value")
            updated, closed = state.update_sliding(value, first, add)
            if updated is None:
                return LATE
            if final:
                return window_results(closed, size, result)
            key = state.message_key
            return window_results([(key, start, aggregate) for start, aggregate in updated], size, result)
        except StateStoreError:
            raise
        except Exception as error:
            raise StepFailed(name, error) from error

    return slid


def _same(aggregate: Any) -> Any:
    return aggregate


def window_results(windows: list[tuple[bytes, int, Any]], size: int, result: Callable[[Any], Any] | None) -> Emitted:
    """What windows (message key, start, aggregate) pass on: each one's `window_result`, of its
    aggregate's `result` (None: the aggregate itself)."""
    return Emitted(
        [
            window_result(key, start, size, aggregate if result is None else result(aggregate))
            for key, start, aggregate in windows
        ]
    )


def _event_time(timestamp: Any) -> int:
    if timestamp.__class__ is not int or timestamp < 0:
        raise ValueError(f"the timestamp function returned {timestamp!r}; event times are ints of ms since the epoch")
    return timestamp


def step_call(step: Step) -> StepCall:
    """The step as a function of (value, states): it raises `StepFailed` for what the step raises,
    except `StateStoreError`, which passes through."""
    function, store, name = step.function, step.store, step.name
    if step.windows is not None and not isinstance(function, Aggregator):
        return function  # an interval join's call of (value, states), made by `interval_joins`
    if isinstance(function, Aggregator):
        if isinstance(step.windows, Sessions):
            return _call_sessions(step, function, step.windows)
        if isinstance(step.windows, SlidingWindows):
            return _call_sliding(step, function, step.windows)
        if isinstance(step.windows, Windows):
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


@dataclass(frozen=True)
class CommitEmission:
    """An aggregation emitting per commit: its store and state key, and how an aggregate becomes
    what is sent (its result, through the stateless steps after it)."""

    store: str
    state_key: bytes
    aggregator: Aggregator
    after: Chain

    def output(self, aggregate: Any) -> Any:
        """What the aggregate sends, or DROPPED when a step after it filtered it out; raises
        `StepFailed` for what a step raises."""
        aggregator = self.aggregator
        try:
            value = aggregator.result(aggregate) if aggregator.has_result else aggregate
        except Exception as error:
            raise StepFailed(self.state_key.decode(errors="replace"), error) from error
        return run_chain(self.after, value, {})


@dataclass(frozen=True)
class IdleWindowStep:
    """A `final()` window step whose stream time advances with the wall clock once its partition is
    idle, and what the windows that then close send (their results through the steps after it)."""

    step: Step
    after: Chain

    @property
    def store(self) -> str:
        assert self.step.store is not None
        return self.step.store

    @property
    def idle_ms(self) -> int:
        assert self.step.idle_ms is not None
        return self.step.idle_ms

    def closed_results(self, closed: list[Any]) -> Emitted:
        """What windows (message key, start, aggregate) or sessions (message key, start, end,
        aggregate) closed by an idle advance send; raises `StepFailed` for what a step raises."""
        step, aggregator = self.step, self.step.function
        assert isinstance(aggregator, Aggregator) and step.windows is not None
        result = aggregator.result if aggregator.has_result else _same
        try:
            if isinstance(step.windows, Sessions):
                emitted = Emitted([session_result(key, start, end, result(agg)) for key, start, end, agg in closed])
            else:
                emitted = window_results(closed, step.windows.size, result)
        except Exception as error:
            raise StepFailed(step.name, error) from error
        return through(emitted, self.after, {})


@dataclass(frozen=True)
class ColumnarAggregation:
    """A frame's first step when a worker may fold it a batch at a time in columns (`vectorized`):
    an aggregation emitting per commit, or a windowed one emitting `final()` windows of the
    messages' timestamps."""

    store: str
    state_key: bytes
    """What follows the message key in each store key: the aggregation's name; for windows, nothing
    (a window's key is its start and the message key, `windows.window_key`)."""
    aggregator: Aggregator
    windows: Windows | None
    name: str
    """The step's name, for the error policy's messages."""
    after: Chain
    """The (stateless) steps after it, which each closed window's result goes through."""

    def closed_results(self, closed: list[tuple[bytes, int, Any]]) -> Emitted:
        """What closed windows (message key, start, aggregate) pass on, as the per-message path's
        window step and the steps after it would; raises `StepFailed` for what a step raises."""
        windows, aggregator = self.windows, self.aggregator
        assert windows is not None
        try:
            emitted = window_results(closed, windows.size, aggregator.result if aggregator.has_result else None)
        except Exception as error:
            raise StepFailed(self.name, error) from error
        return through(emitted, self.after, {})


def field_reader(name: str, reader: str) -> Callable[[Any], Any]:
    """A function reading field `name` of a dict value, for `reader` (named in its errors)."""

    def field_of(value: Any) -> Any:
        if not isinstance(value, dict):
            raise TypeError(f"{reader} reads a field of a dict value, got {type(value).__name__}")
        if name not in value:
            raise KeyError(f"the value has no field {name!r}")
        return value[name]

    return field_of


def run_chain(chain: Chain, value: Any, states: Views) -> Any:
    """The value after every step of `chain`, or DROPPED when a filter or a fold took it; after a
    window step, the `Emitted` window results, each through the steps that follow it."""
    for index, (kind, call) in enumerate(chain):
        result = call(value, states)
        if kind is StepKind.FOLD:
            return DROPPED  # its results flow at the commit (`CommitEmission`)
        if kind is StepKind.WINDOW:
            return through(result, chain[index + 1 :], states)
        if kind in REPLACING:
            value = result
        elif kind is StepKind.FILTER and not result:
            return DROPPED
        elif kind is StepKind.JOIN:
            if result is DROPPED:
                return DROPPED
            value = result
    return value


def through(emitted: Emitted, chain: Chain, states: Views) -> Emitted:
    """Window results, each through the (stateless) steps of `chain`."""
    if emitted.late or not chain:
        return emitted
    out = Emitted()
    for key, value in emitted:
        if value is not ENDED:  # a table join's tombstone passes the steps by
            value = run_chain(chain, value, states)
        if value is not DROPPED:
            out.append((key, value))
    return out
