"""The processing steps of an app, declared in the style of Quix Streams' StreamingDataFrame.

Owns `StreamingDataFrame` (each step it declares runs as `steps.step_call` makes it): `apply`
maps a value, `update` runs a function for its effect and passes the value through, `filter`
drops values for which it returns false. A step is stateful when declared so: it then receives
the `State` of its store (the app's only store unless named) as second argument. `aggregate`
folds each value into a per-key aggregate (`aggregations.Aggregator`) kept in a store of its own,
and passes on the updated result. `run` pushes one value through every step; what a step raises
is a `StepFailed` for the error policy, except a `StateStoreError` (a damaged or unwritable
store), which is the store's failure, not the message's, and passes through as it is.
`tumbling_window`, `hopping_window`, `sliding_window` and `session_window` declare windowed
aggregations (`windows.WindowedAggregation`, `sliding.SlidingWindows`, `sessions.Sessions`): their
step passes on an `Emitted` list of window results, which the stateless steps after it map one by
one. `compiled` gives the worker's hot path a function
that does what `run` does, specialised for the common one-step frame. An aggregation that emits
per commit (the default of the columnar ones, `Count()` and `Sum("field")` say) passes nothing on
while processing: `commit_emission` describes what the worker sends at each commit instead (each
changed key's latest result, through the steps after it), and `vectorized` says when the worker
may fold whole batches in columns. `group_by` re-keys the records (`group_by.GroupBy`): the steps
declared before it (stateless only) run on the source's records, and those after it on the
re-keyed records read back from the repartition topic, with state kept by the new key.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from dagster_stateful.core.config import Repartition
from dagster_stateful.core.processing.dsl.aggregations import Aggregator
from dagster_stateful.core.processing.dsl.group_by import GroupBy, KeyOf, refuse_group_by
from dagster_stateful.core.processing.dsl.interval_joins import IntervalJoinDeclarations, StreamJoin
from dagster_stateful.core.processing.dsl.joins import (
    Table,
)
from dagster_stateful.core.processing.dsl.sessions import Sessions
from dagster_stateful.core.processing.dsl.steps import (
    DROPPED,
    REPLACING,
    AggregateEmit,
    Chain,
    ColumnarAggregation,
    CommitEmission,
    IdleWindowStep,
    Step,
    StepCall,
    StepFailed,
    StepKind,
    Views,
    run_chain,
    step_call,
)
from dagster_stateful.core.processing.dsl.table_join_declarations import TableJoinDeclarations
from dagster_stateful.core.processing.dsl.table_table_joins import TableTableJoinDeclarations
from dagster_stateful.core.processing.dsl.timers import OnTimer, Timer
from dagster_stateful.core.processing.dsl.window_declarations import AnyWindows, WindowDeclarations
from dagster_stateful.core.processing.dsl.windows import Emit, Windows
from dagster_stateful.core.state.kv import State
from dagster_stateful.core.state.session_state import SessionBounds
from dagster_stateful.core.state.window_state import WindowBounds
from dagster_stateful.errors import ConfigurationError

__all__ = ["DROPPED", "CommitEmission", "Step", "StepFailed", "StreamingDataFrame", "Views"]


class StreamingDataFrame(
    WindowDeclarations, IntervalJoinDeclarations, TableTableJoinDeclarations, TableJoinDeclarations
):
    """The app's steps, in order. Methods add a step and return the same frame."""

    def __init__(
        self,
        store_names: list[str],
        expiring: frozenset[str] = frozenset(),
        evicting: frozenset[str] = frozenset(),
        on_group_by: Callable[[Repartition], None] | None = None,
    ) -> None:
        """expiring: the stores declared with a ttl (only apply, update and filter steps may use them);
        evicting: the LRU stores (windows may not use them); on_group_by: told of a re-keying (the
        app's configuration then names its repartition topic)."""
        self._on_group_by = on_group_by
        self.grouping: GroupBy | None = None
        """The re-keying, once `group_by` declared it (its steps before it are its own)."""
        self._store_names = store_names
        self._expiring = expiring
        self._evicting = evicting
        self._steps: tuple[Step, ...] = ()
        self._chain: Chain = ()
        """(kind, `_call_step`) per step, for `run` (one attribute lookup per message, not four per step)."""
        self.table_joins: dict[str, tuple[Table, int]] = {}
        """The partitioned tables the steps join with, by name, with each join's grace in ms."""
        self.global_joins: list[str] = []
        """The global tables the steps join with, by name (those before `group_by` are in its
        `Repartition.joined_before`)."""
        self.timers: OnTimer | None = None
        self.stream_join: StreamJoin | None = None
        """The interval join with another stream (`join_interval`), whose records the worker runs through it."""
        """What the app calls when a timer fires (`on_timer`), and the store the timers are kept in."""
        self.source_table_joins: dict[str, tuple[Table, int]] = {}
        """The partitioned tables joined before `group_by`, on the source's message key: co-partitioned
        with the source, they are kept beside its partitions (`table_joins` holds those after it)."""

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
    def window_stores(self) -> list[str]:
        """The stores of windowed aggregations (each keeps a stream time)."""
        return [name for name, bounds in self.live_stores.items() if bounds is not None]

    @property
    def live_stores(self) -> dict[str, WindowBounds | SessionBounds | None]:
        """The aggregations' stores: None for a keyed aggregation's, the bounds of a window or
        session store's."""
        return {
            step.store: None if step.windows is None else step.windows.bounds
            for step in self.steps
            if step.aggregation is not None and step.store
        }

    @property
    def commit_emission(self) -> CommitEmission | None:
        """What an aggregation emitting per commit sends at each commit, or None without one."""
        for index, step in enumerate(self.steps):
            if step.per_commit:
                assert isinstance(step.function, Aggregator) and step.store is not None
                return CommitEmission(step.store, step.name.encode(), step.function, self._chain[index + 1 :])
        return None

    @property
    def vectorized(self) -> ColumnarAggregation | None:
        """The first step when a worker may fold whole batches of it in columns: a columnar
        aggregation (`Aggregator.vectorizable`) emitting per commit, or windowed over the messages'
        timestamps and emitting `final()`, with no other stateful step."""
        if not self.steps:
            return None
        first = self.steps[0]
        aggregator = first.function
        if not (isinstance(aggregator, Aggregator) and aggregator.vectorizable):
            return None
        windows = first.windows
        if windows is not None and not isinstance(windows, Windows):
            return None  # sessions and sliding windows keep the per-message path
        if not (first.per_commit or (windows is not None and first.emit == "final" and windows.timestamp is None)):
            return None
        if any(step.store is not None for step in self.steps[1:]):
            return None
        assert first.store is not None
        state_key = b"" if windows is not None else first.name.encode()
        return ColumnarAggregation(first.store, state_key, aggregator, windows, first.name, self._chain[1:])

    @property
    def idle_windows(self) -> list[IdleWindowStep]:
        """The window steps whose stream time advances with the wall clock once their partition is idle
        (`final(advance_when_idle=...)`)."""
        return [
            IdleWindowStep(step, self._chain[index + 1 :])
            for index, step in enumerate(self.steps)
            if step.idle_ms is not None
        ]

    @property
    def stream_join_after(self) -> Chain:
        """The steps after the interval join, which its results for the joined stream's records go through."""
        return () if self.stream_join is None else self._chain[self.stream_join.after_index :]

    @property
    def is_windowed(self) -> bool:
        return any(step.windows is not None for step in self.steps)

    def changelog_configs(self) -> dict[str, dict[str, str]]:
        """Changelog topic settings of the stores that need their own (the window stores')."""
        return {step.store: step.windows.changelog_config() for step in self.steps if step.windows and step.store}

    def apply(self, function: Callable[..., Any], *, stateful: bool = False, store: str | None = None):
        """Replace the value with `function(value)` or, stateful, `function(value, state)`."""
        return self._add(StepKind.APPLY, function, stateful, store)

    def update(self, function: Callable[..., Any], *, stateful: bool = False, store: str | None = None):
        """Call `function` for its effect (on state, say); the value passes through unchanged."""
        return self._add(StepKind.UPDATE, function, stateful, store)

    def filter(self, function: Callable[..., Any], *, stateful: bool = False, store: str | None = None):
        """Keep the value only when `function` returns true."""
        return self._add(StepKind.FILTER, function, stateful, store)

    def group_by(self, key: str | KeyOf, *, name: str | None = None, partitions: int | None = None):
        """Re-key each record by `key`, a field of its value or a function of it, as Kafka Streams'
        `groupBy` does: the records go, under their new key, through the internal topic
        `<app>-<name>-repartition` (`name`: the field's name unless given; a function needs one),
        with `partitions` partitions (the source's unless set), and the steps declared after this
        read them back, with state kept by the new key. Only stateless steps may come before it. The
        new key is written with the app's key serde, the value with its value serde. A record
        whose key cannot be had (a missing field, a function that raises or returns None) goes to
        the error policy."""
        refuse_group_by(
            self.grouping,
            self.is_windowed,
            sorted(name for name, (_, grace_ms) in self.table_joins.items() if grace_ms),
            [step.name for step in self.steps if step.store is not None],
        )
        grouping = GroupBy.define(key, name, partitions, self._chain)
        repartition = Repartition(grouping.name, partitions, (*self.table_joins, *self.global_joins))
        self.grouping = grouping
        self.source_table_joins, self.table_joins = self.table_joins, {}
        self._steps, self._chain = (), ()
        if self._on_group_by is not None:
            self._on_group_by(repartition)
        return self

    def aggregate(
        self,
        aggregator: Aggregator,
        *,
        store: str | None = None,
        name: str | None = None,
        emit: AggregateEmit | None = None,
    ):
        """Fold each value into its message key's aggregate and pass on the result, as Kafka Streams'
        `groupByKey().aggregate(...)` does: `aggregator` is a `Count`, `Sum`, `Min`, `Max`, `Mean`,
        `Reduce`, `Aggregate` or an `Aggregator` of your own. The aggregate is kept in `store` (the
        app's only store unless named) under state key `name` (the aggregator's name unless given);
        that store is then the aggregations' own: no stateful apply, update or filter may use it.

        emit="per-commit" passes on each changed key's latest result once per commit (Kafka Streams'
        record cache; the steps after it then run at the commit), "per-message" the result after
        every message. The default is per commit for the columnar aggregators (`Count()`, and `Sum`,
        `Min`, `Max`, `Mean` of a named field), which a worker then folds a batch at a time, and per
        message for the others. After an aggregation emitting per commit only stateless steps may come."""
        if not isinstance(aggregator, Aggregator):
            raise TypeError(f"aggregate needs an Aggregator (Count(), Sum(...), Aggregate(...)), got {aggregator!r}")
        if emit not in (None, "per-commit", "per-message"):
            raise ConfigurationError(f"emit is 'per-commit' or 'per-message', got {emit!r}")
        per_commit = emit == "per-commit" or (emit is None and aggregator.vectorizable)
        self._refuse_after_per_commit("an aggregation")
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
        return self._append(Step(StepKind.AGGREGATE, aggregator, resolved, name, per_commit=per_commit))

    def _add_windowed(
        self,
        windows: AnyWindows,
        aggregator: Aggregator,
        name: str,
        store: str | None,
        emit: Emit,
        idle_ms: int | None = None,
    ) -> StreamingDataFrame:
        if isinstance(windows, Sessions):
            windows.check(aggregator)
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
        return self._append(Step(StepKind.WINDOW, aggregator, resolved, name, windows, emit, idle_ms=idle_ms))

    def _join_store(self, store: str | None) -> str:
        return self._resolve_store(store)

    def _add_stream_join(
        self, join: Any, left: StepCall, right: StepCall, name: str, store: str | None
    ) -> StreamingDataFrame:
        if self.stream_join is not None or self.table_joins:
            raise ConfigurationError("an app's steps join one stream, and then no partitioned table")
        resolved = self._resolve_store(store)
        self._refuse_expiring(resolved, f"a {join.kind}")
        if resolved in self._evicting or any(step.store == resolved for step in self.steps):
            raise ConfigurationError(f"a {join.kind} keeps its records in a store of its own, not {resolved!r}")
        self._refuse_after_windows(f"a {join.kind}")
        self._refuse_after_per_commit(f"a {join.kind}")
        self._append(Step(StepKind.WINDOW, left, resolved, name, join))
        self.stream_join = StreamJoin(join, resolved, right, len(self._chain))
        return self

    def _refuse_expiring(self, store: str, what: str) -> None:
        """Refuse a store with a ttl (or, for an aggregation, the store of the app's timers) for `what`."""
        if store in self._expiring:
            raise ConfigurationError(
                f"store {store!r} has a ttl, which {what} cannot use: windows expire by their retention, an "
                "aggregate by key and a timer live until deleted. Declare another store without a ttl and name it "
                "with store=..."
            )
        if self.timers is not None and self.timers.store == store:
            raise ConfigurationError(f"store {store!r} keeps the app's timers: {what} needs a store of its own")

    def _refuse_after_windows(self, what: str) -> None:
        if self.is_windowed:
            raise ConfigurationError(
                f"{what} cannot follow a windowed aggregation: its results belong to windows, not to the message's "
                "key. After a windowed aggregation only stateless apply, update and filter steps may come."
            )

    def _refuse_after_per_commit(self, what: str) -> None:
        if any(step.per_commit for step in self.steps):
            raise ConfigurationError(
                f"{what} cannot follow an aggregation that emits per commit: its results flow once per key and "
                "commit, not per message. Only stateless apply, update and filter steps may follow it; give the "
                "aggregation emit='per-message' to chain stateful steps after it."
            )

    def _add(self, kind: StepKind, function: Callable[..., Any], stateful: bool, store: str | None):
        if not callable(function):
            raise TypeError(f"{kind} needs a callable, got {function!r}")
        if store is not None:
            stateful = True
        resolved = self._resolve_store(store) if stateful else None
        if resolved is not None and resolved in self.aggregated_stores:
            raise self._shared_store(resolved)
        if stateful:
            self._refuse_after_per_commit(f"a stateful {kind}")
        if resolved is not None:
            self._refuse_after_windows(f"a stateful {kind}")
        return self._append(Step(kind, function, resolved))

    def _append(self, step: Step):
        if isinstance(step.function, Aggregator) and step.function.vectorizable:
            # The columnar path's NumPy and Arrow load as the app is declared, not when its worker starts.
            import numpy  # noqa: F401
            import pyarrow  # noqa: F401

        self._steps += (step,)
        self._chain += ((StepKind.FOLD if step.per_commit else step.kind, step_call(step)),)
        return self

    def on_timer(self, function: Callable[[Timer, State], Any], *, store: str | None = None) -> StreamingDataFrame:
        """Call `function(timer, state)` when a timer fires: one a stateful step scheduled with
        `state.schedule(name, at)` (due when the partition's stream time reaches `at`) or
        `state.schedule(name, at, wall_clock=True)` (due when the clock does), in `store` (the app's
        only store unless named). `state` is the timer's key's state; what the function returns,
        unless None, goes to the output topic under the timer's key (see `timers.OnTimer`)."""
        if self.timers is not None:
            raise ConfigurationError(f"this app already handles timers with {self.timers.name!r}; one on_timer per app")
        if not callable(function):
            raise TypeError(f"on_timer needs a function (timer, state) -> result or None, got {function!r}")
        resolved = self._resolve_store(store)
        self._refuse_expiring(resolved, "timers")
        if resolved in self._evicting or resolved in self.aggregated_stores:
            raise ConfigurationError(
                f"store {resolved!r} cannot keep timers: an LRU store would evict them and an aggregation's store "
                "holds its aggregates alone. Keep them in the store of the steps that schedule them."
            )
        self.timers = OnTimer(resolved, function)
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
        if len(self._chain) != 1 or self._chain[0][0] in (StepKind.FILTER, StepKind.JOIN):
            return functools.partial(run_chain, self._chain)
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
        return run_chain(self._chain, value, states)
