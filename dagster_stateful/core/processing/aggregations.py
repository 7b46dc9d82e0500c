"""Keyed aggregations: what `StreamingDataFrame.aggregate` folds each message into, per message key.

Owns `Aggregator` (the contract: `first` makes the aggregate of a key's first value, `add` folds
one more value into it, `result` turns it into what flows downstream) and the built-in ones, in
the manner of Kafka Streams' `groupByKey().count()` / `reduce` / `aggregate` and Quix Streams'
window aggregations: `Count`, `Sum`, `Min`, `Max`, `Mean`, `Reduce`, `Collect` (every value, in
order) and `Aggregate` (an initializer and a function, like Kafka Streams' `aggregate(initializer,
aggregator)`).

An aggregate lives in its store as its state serializer's bytes (JSON by default), but between
commits the engine keeps it as the object `add` returned and serializes it once per commit, so
`add` must return a new value rather than change the one it is given, and the value must be one
the state serializer can encode (for JSON: numbers, strings, lists, dicts).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Aggregate", "Aggregator", "Collect", "Count", "Max", "Mean", "Min", "Reduce", "Sum"]

Extract = Callable[[Any], Any]
"""The number (or value) an aggregator takes from a message's value."""


def _whole(value: Any) -> Any:
    return value


class Aggregator:
    """Folds the values of one message key into an aggregate. Subclasses define `first` and `add`,
    and `result` when what flows downstream differs from the aggregate kept in the store."""

    name = "aggregate"
    """The state key the aggregate is stored under (one per message key); `aggregate(name=...)` overrides it."""
    has_result = False
    """Whether `result` differs from the aggregate (when not, the engine skips calling it)."""

    def first(self, value: Any) -> Any:
        """The aggregate of a key whose first value is `value`."""
        raise NotImplementedError

    def add(self, aggregate: Any, value: Any) -> Any:
        """A new aggregate: `aggregate` with `value` folded in (never change `aggregate` in place)."""
        raise NotImplementedError

    def result(self, aggregate: Any) -> Any:
        """What flows to the next step (and the output topic) after an update."""
        return aggregate


class Count(Aggregator):
    """How many messages the key had."""

    name = "count"

    def first(self, value: Any) -> int:
        return 1

    def add(self, aggregate: int, value: Any) -> int:
        return aggregate + 1


class _OfValue(Aggregator):
    """An aggregator of a number taken from each value: `of(value)` (the value itself by default)."""

    def __init__(self, of: Extract = _whole) -> None:
        self._of = of

    def first(self, value: Any) -> Any:
        return self._of(value)


class Sum(_OfValue):
    """The sum of `of(value)` over the key's messages."""

    name = "sum"

    def add(self, aggregate: Any, value: Any) -> Any:
        return aggregate + self._of(value)


class Min(_OfValue):
    """The least `of(value)` over the key's messages."""

    name = "min"

    def add(self, aggregate: Any, value: Any) -> Any:
        candidate = self._of(value)
        return candidate if candidate < aggregate else aggregate


class Max(_OfValue):
    """The greatest `of(value)` over the key's messages."""

    name = "max"

    def add(self, aggregate: Any, value: Any) -> Any:
        candidate = self._of(value)
        return candidate if candidate > aggregate else aggregate


class Mean(_OfValue):
    """The mean of `of(value)` over the key's messages; the store keeps [sum, count]."""

    name = "mean"
    has_result = True

    def first(self, value: Any) -> list[Any]:
        return [self._of(value), 1]

    def add(self, aggregate: list[Any], value: Any) -> list[Any]:
        return [aggregate[0] + self._of(value), aggregate[1] + 1]

    def result(self, aggregate: list[Any]) -> float:
        return aggregate[0] / aggregate[1]


class Collect(_OfValue):
    """Every `of(value)` of the key's messages (of a window's, with a window), in the order they came
    (Quix Streams' `collect()`). The list is copied on each message, so keep it for windows or
    keys with a bounded number of messages."""

    name = "collect"

    def first(self, value: Any) -> list[Any]:
        return [self._of(value)]

    def add(self, aggregate: list[Any], value: Any) -> list[Any]:
        return [*aggregate, self._of(value)]


class Reduce(Aggregator):
    """`reducer(aggregate, value)` over the key's messages, starting from its first value (Kafka
    Streams' `reduce`, Quix Streams' `reduce` without an initializer)."""

    name = "reduce"

    def __init__(self, reducer: Callable[[Any, Any], Any]) -> None:
        self._reducer = reducer

    def first(self, value: Any) -> Any:
        return value

    def add(self, aggregate: Any, value: Any) -> Any:
        return self._reducer(aggregate, value)


class Aggregate(Aggregator):
    """`aggregator(aggregate, value)` over the key's messages, starting from `initializer()`
    (Kafka Streams' `aggregate(initializer, aggregator)`)."""

    def __init__(self, initializer: Callable[[], Any], aggregator: Callable[[Any, Any], Any]) -> None:
        self._initializer = initializer
        self._aggregator = aggregator

    def first(self, value: Any) -> Any:
        return self._aggregator(self._initializer(), value)

    def add(self, aggregate: Any, value: Any) -> Any:
        return self._aggregator(aggregate, value)
