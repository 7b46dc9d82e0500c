"""Keyed aggregations: what `StreamingDataFrame.aggregate` folds each message into, per message key.

Owns `Aggregator` (the contract: `first` makes the aggregate of a key's first value, `add` folds
one more value into it, `result` turns it into what flows downstream) and the built-in ones, in
the manner of Kafka Streams' `groupByKey().count()` / `reduce` / `aggregate` and Quix Streams'
window aggregations: `Count`, `Sum`, `Min`, `Max`, `Mean`, `Reduce`, `Collect` (every value, in
order) and `Aggregate` (an initializer and a function, like Kafka Streams' `aggregate(initializer,
aggregator)`). Session windows also `combine` two aggregates of one key (the sessions a record
bridges): the columnar ones and `Collect` and `Reduce` can, `Aggregate` with a `merger`.

`Count()` and `Sum`, `Min`, `Max` and `Mean` of a named field (`Sum("amount")`) are columnar: a
worker folds a whole consumed batch of them at once (`vectorized`), merging each key's partial into
its aggregate with `merge`, and their results are emitted once per key and commit by default.

An aggregate lives in its store as its state serializer's bytes (JSON by default), but between
commits the engine keeps it as the object `add` returned and serializes it once per commit, so
`add` must return a new value rather than change the one it is given, and the value must be one
the state serializer can encode (for JSON: numbers, strings, lists, dicts).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import Any, ClassVar, Literal

__all__ = ["Aggregate", "Aggregator", "Collect", "Count", "Max", "Mean", "Min", "Reduce", "Sum"]

Extract = Callable[[Any], Any]
"""The number (or value) an aggregator takes from a message's value."""

Columnar = Literal["count", "sum", "min", "max", "mean"]
"""The folds a worker runs over a whole batch in columns (see `vectorized`)."""


def _whole(value: Any) -> Any:
    return value


class Aggregator:
    """Folds the values of one message key into an aggregate. Subclasses define `first` and `add`,
    and `result` when what flows downstream differs from the aggregate kept in the store."""

    name = "aggregate"
    """The state key the aggregate is stored under (one per message key); `aggregate(name=...)` overrides it."""
    has_result = False
    """Whether `result` differs from the aggregate (when not, the engine skips calling it)."""
    columnar: ClassVar[Columnar | None] = None
    """The batch fold this aggregator is, when it takes a named field (or none, as `Count`)."""
    field: str | None = None
    """The field of the (JSON object) value the aggregator takes, when named (`Sum("amount")`)."""

    @property
    def vectorizable(self) -> bool:
        """Whether a worker may fold whole batches of this aggregator in columns."""
        return self.columnar == "count" or (self.columnar is not None and self.field is not None)

    def first(self, value: Any) -> Any:
        """The aggregate of a key whose first value is `value`."""
        raise NotImplementedError

    def add(self, aggregate: Any, value: Any) -> Any:
        """A new aggregate: `aggregate` with `value` folded in (never change `aggregate` in place)."""
        raise NotImplementedError

    def result(self, aggregate: Any) -> Any:
        """What flows to the next step (and the output topic) after an update."""
        return aggregate

    def merge(self, aggregate: Any, partial: Any) -> Any:
        """A columnar aggregator's aggregate with a batch's partial of the same key folded in."""
        raise NotImplementedError(f"{type(self).__name__} has no columnar merge")

    @property
    def combinable(self) -> bool:
        """Whether two aggregates of one key can become one (`combine`), as session windows need
        when a record bridges two sessions."""
        return self.columnar is not None

    def combine(self, earlier: Any, later: Any) -> Any:
        """One aggregate of the values of two (`earlier`'s first): a columnar aggregator's `merge`."""
        return self.merge(earlier, later)


class Count(Aggregator):
    """How many messages the key had."""

    name = "count"
    columnar = "count"

    def merge(self, aggregate: int, partial: int) -> int:
        return aggregate + partial

    def first(self, value: Any) -> int:
        return 1

    def add(self, aggregate: int, value: Any) -> int:
        return aggregate + 1


def _number_in(field: str, aggregator: str) -> Extract:
    """The number in `field` of a value; a value whose field holds anything else (a bool, a string,
    a list) is refused as the bad message it is, rather than kept in an aggregate that every later
    message of its key would then fail on."""
    get = itemgetter(field)

    def number(value: Any) -> Any:
        found = get(value)
        if found.__class__ is not int and found.__class__ is not float:
            raise TypeError(f"{aggregator}({field!r}) takes numbers; the value's {field!r} is {found!r}")
        return found

    return number


class _OfValue(Aggregator):
    """An aggregator of a number taken from each value: `of(value)` (the value itself by default), or
    the field `of` of a JSON object value when `of` is a str (`Sum("amount")`, which is columnar, and
    takes only numbers from the field)."""

    def __init__(self, of: Extract | str = _whole) -> None:
        if isinstance(of, str):
            self.field = of
            self._of: Extract = _number_in(of, type(self).__name__) if self.columnar else itemgetter(of)
        elif callable(of):
            self._of = of
        else:
            raise TypeError(f"{type(self).__name__} takes a field name or a function of the value, got {of!r}")

    def first(self, value: Any) -> Any:
        return self._of(value)


class Sum(_OfValue):
    """The sum of `of(value)` over the key's messages."""

    name = "sum"
    columnar = "sum"

    def merge(self, aggregate: Any, partial: Any) -> Any:
        return aggregate + partial

    def add(self, aggregate: Any, value: Any) -> Any:
        return aggregate + self._of(value)


class Min(_OfValue):
    """The least `of(value)` over the key's messages."""

    name = "min"
    columnar = "min"

    def merge(self, aggregate: Any, partial: Any) -> Any:
        return min(aggregate, partial)  # on a tie, the aggregate (the first argument), as `add` keeps it

    def add(self, aggregate: Any, value: Any) -> Any:
        candidate = self._of(value)
        return candidate if candidate < aggregate else aggregate


class Max(_OfValue):
    """The greatest `of(value)` over the key's messages."""

    name = "max"
    columnar = "max"

    def merge(self, aggregate: Any, partial: Any) -> Any:
        return max(aggregate, partial)

    def add(self, aggregate: Any, value: Any) -> Any:
        candidate = self._of(value)
        return candidate if candidate > aggregate else aggregate


class Mean(_OfValue):
    """The mean of `of(value)` over the key's messages; the store keeps [sum, count]."""

    name = "mean"
    has_result = True
    columnar = "mean"

    def merge(self, aggregate: list[Any], partial: list[Any]) -> list[Any]:
        return [aggregate[0] + partial[0], aggregate[1] + partial[1]]

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

    @property
    def combinable(self) -> bool:
        return True

    def combine(self, earlier: list[Any], later: list[Any]) -> list[Any]:
        return [*earlier, *later]


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

    @property
    def combinable(self) -> bool:
        return True

    def combine(self, earlier: Any, later: Any) -> Any:
        """The reducer of two aggregates (values and aggregates are alike to a reducer)."""
        return self._reducer(earlier, later)


class Aggregate(Aggregator):
    """`aggregator(aggregate, value)` over the key's messages, starting from `initializer()`
    (Kafka Streams' `aggregate(initializer, aggregator)`); in session windows, `merger(earlier,
    later)` makes one aggregate of two sessions a record bridges (Kafka Streams' session `Merger`)."""

    def __init__(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any], Any],
        merger: Callable[[Any, Any], Any] | None = None,
    ) -> None:
        self._initializer = initializer
        self._aggregator = aggregator
        self._merger = merger

    @property
    def combinable(self) -> bool:
        return self._merger is not None

    def combine(self, earlier: Any, later: Any) -> Any:
        if self._merger is None:
            raise NotImplementedError("Aggregate needs a merger= to combine two aggregates")
        return self._merger(earlier, later)

    def first(self, value: Any) -> Any:
        return self._aggregator(self._initializer(), value)

    def add(self, aggregate: Any, value: Any) -> Any:
        return self._aggregator(aggregate, value)
