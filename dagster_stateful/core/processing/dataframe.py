"""The processing steps of an app, declared in the style of Quix Streams' StreamingDataFrame.

Owns `Step` and `StreamingDataFrame`: `apply` maps a value, `update` runs a function for its
effect and passes the value through, `filter` drops values for which it returns false. A step is
stateful when declared so: it then receives the `State` of its store (the app's only store unless
named) as second argument. `run` pushes one value through every step; what a step raises is a
`StepFailed` for the error policy, except a `StateStoreError` (a damaged or unwritable store),
which is the store's failure, not the message's, and passes through as it is. `compiled` gives the
worker's hot path a function that does what `run` does, specialised for the common one-step frame.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dagster_stateful.core.state.transaction import State
from dagster_stateful.errors import ConfigurationError, StateStoreError

DROPPED = object()


class StepFailed(Exception):
    """A step raised; carries which one, for the error policy's message."""

    def __init__(self, step: str, error: Exception) -> None:
        super().__init__(f"step {step!r} raised {type(error).__name__}: {error}")
        self.step = step
        self.error = error


@dataclass(frozen=True)
class Step:
    kind: str
    function: Callable[..., Any]
    store: str | None
    """The store a stateful step reads and writes; None for a stateless step."""

    @property
    def name(self) -> str:
        return getattr(self.function, "__name__", repr(self.function))


StepCall = Callable[[Any, Mapping[str, State]], Any]
"""(value, states by store) -> what the step returns."""


def _call_step(step: Step) -> StepCall:
    """The step as a function of (value, states): it raises `StepFailed` for what the step raises,
    except `StateStoreError`, which passes through."""
    function, store, name = step.function, step.store, step.name

    def call(value: Any, states: Mapping[str, State]) -> Any:
        try:
            return function(value) if store is None else function(value, states[store])
        except StateStoreError:
            raise
        except Exception as error:
            raise StepFailed(name, error) from error

    return call


class StreamingDataFrame:
    """The app's steps, in order. Methods add a step and return the same frame."""

    def __init__(self, store_names: list[str]) -> None:
        self._store_names = store_names
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

    def apply(self, function: Callable[..., Any], *, stateful: bool = False, store: str | None = None):
        """Replace the value with `function(value)` or, stateful, `function(value, state)`."""
        return self._add("apply", function, stateful, store)

    def update(self, function: Callable[..., Any], *, stateful: bool = False, store: str | None = None):
        """Call `function` for its effect (on state, say); the value passes through unchanged."""
        return self._add("update", function, stateful, store)

    def filter(self, function: Callable[..., Any], *, stateful: bool = False, store: str | None = None):
        """Keep the value only when `function` returns true."""
        return self._add("filter", function, stateful, store)

    def _add(self, kind: str, function: Callable[..., Any], stateful: bool, store: str | None):
        if not callable(function):
            raise TypeError(f"{kind} needs a callable, got {function!r}")
        if store is not None:
            stateful = True
        step = Step(kind, function, self._resolve_store(store) if stateful else None)
        self._steps += (step,)
        self._chain += ((step.kind, _call_step(step)),)
        return self

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
        if kind == "apply":
            return call

        def update_one(value: Any, states: Mapping[str, State]) -> Any:
            call(value, states)
            return value

        return update_one

    def run(self, value: Any, states: Mapping[str, State]) -> Any:
        """The value after every step, or DROPPED when a filter dropped it."""
        for kind, call in self._chain:
            result = call(value, states)
            if kind == "apply":
                value = result
            elif kind == "filter" and not result:
                return DROPPED
        return value
