"""Joins with tables: what `StreamingDataFrame.join` declares, and how a join step runs.

Owns the two kinds of table and their join steps. `GlobalTable` (a compacted topic every worker
keeps whole, declared with `App.global_table`, Kafka Streams' GlobalKTable): `join_function` finds
the table key in the stream record (`on`: a field of its value, or a function of it, as a foreign
key) and reads the table's latest value for it (`GlobalTable.lookup`, from the worker's copy).
`Table` (a compacted topic co-partitioned with the records it joins, declared with `App.table`,
Kafka Streams' KTable, versioned when it keeps `history`): `table_join_function` joins on the
message key, reading the row the worker found for the record being processed (`Table.row`: the
latest value, or the value as of the record's timestamp for a versioned table). Either join
merges the two: an inner join drops a record whose key the table does not hold, a left join
passes it on with no table value. Merging two dicts keeps every field of both ("raise" refuses a
field both have, "keep-left" or "keep-right" choose), or a function `(value, row) -> value` does it.
A record without the key, or a merge that fails, is the error policy's, as any step's failure.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from dagster_stateful.core.processing.dsl.steps import DROPPED, field_reader
from dagster_stateful.core.state.serialization import Serde, fast_loads
from dagster_stateful.errors import ConfigurationError, StateStoreError

JoinHow = Literal["inner", "left"]
OnMerge = Literal["raise", "keep-left", "keep-right"] | Callable[[Any, Any], Any]
TableKeyOf = Callable[[Any], Any]

NO_TABLE_KEY = "a join with a partitioned table needs a message key; this message has none"


@dataclass(eq=False)
class GlobalTable:
    """A table every worker of the app keeps whole, from the compacted `topic`: the latest value of
    each key (a tombstone deletes it), read at start up to the topic's end and kept current while
    processing, never part of the consumer group's assignment."""

    name: str
    topic: str
    key_serde: Serde
    value_serde: Serde
    _readers: threading.local = field(default_factory=threading.local, repr=False)

    def bind_reader(self, reader: Callable[[bytes], bytes | None] | None) -> None:
        """The worker running in this thread reads the table through `reader` (None: no longer)."""
        self._readers.reader = reader

    def lookup(self, key: Any) -> Any | None:
        """The table's latest value for `key` in this thread's worker's copy (None: it holds none)."""
        reader = getattr(self._readers, "reader", None)
        if reader is None:
            raise StateStoreError(f"global table {self.name!r} is read inside a worker only (none has opened it here)")
        raw = reader(self.key_serde.dumps(key))
        return None if raw is None else self.value_serde.loads(raw)


@dataclass(eq=False)
class Table:
    """A table partitioned as the records that join it: the compacted `topic` is co-partitioned
    with the app's task topic, and a worker keeps the table partitions of the tasks it holds. With
    `history_ms`, every version of a key is kept that long (a versioned table), and a record joins
    the value as of its timestamp; without, the latest value when the record is processed."""

    name: str
    topic: str
    key_serde: Serde
    value_serde: Serde
    history_ms: int | None = None
    _readers: threading.local = field(default_factory=threading.local, repr=False)
    _loads: Callable[[bytes], Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._loads = fast_loads(self.value_serde)

    @property
    def versioned(self) -> bool:
        return self.history_ms is not None

    def bind_reader(self, reader: Callable[[], bytes | None] | None) -> None:
        """The worker running in this thread finds the row of the record it processes with `reader`
        (None: no longer)."""
        self._readers.reader = reader

    def row(self) -> Any | None:
        """The table's row for the record being processed in this thread (None: the table holds none)."""
        reader = getattr(self._readers, "reader", None)
        if reader is None:
            raise StateStoreError(f"table {self.name!r} is read inside a worker only (none has opened it here)")
        raw = reader()
        if raw is None:
            return None
        try:
            return self._loads(raw)
        except ValueError:  # the serde's own error says more (rows decoded when they were applied, though)
            return self.value_serde.loads(raw)


def table_join_function(table: Table, how: JoinHow, on_merge: OnMerge) -> Callable[[Any], Any]:
    """A partitioned table's join on the message key, named `join <table>`, as `join_function`'s.
    It reads and decodes the row as `Table.row` does, inline (`Table.row` raises what it would)."""
    merge = _merge_of(how, on_merge)
    keep_left = on_merge == "keep-left"
    readers, loads = table._readers, table._loads

    def join(value: Any) -> Any:
        reader = getattr(readers, "reader", None)
        raw = reader() if reader is not None else table.row()
        if raw is None:
            return DROPPED if how == "inner" else value
        try:
            row = loads(raw)
        except ValueError:
            row = table.row()
        if keep_left and value.__class__ is dict and row.__class__ is dict:
            return {**row, **value}  # the merge's, without a call
        return merge(value, row)

    join.__name__ = f"join {table.name}"
    return join


def record_fault(table: GlobalTable | Table, key: bytes | None, value: bytes | None) -> Exception | None:
    """Why a record of `table`'s topic cannot be applied (no key, or a key or value its serdes refuse);
    None when it can."""
    try:
        if key is None:
            raise ValueError("a table record needs a key")
        table.key_serde.loads(key)
        if value is not None:
            table.value_serde.loads(value)
    except Exception as error:  # noqa: BLE001 - any codec failure is the record's fault
        return error
    return None


def table_key_of(on: str | TableKeyOf) -> TableKeyOf:
    if callable(on):
        return on
    if not isinstance(on, str) or not on:
        raise ConfigurationError(f"join needs on= a field name or a function of the value, got {on!r}")

    return field_reader(on, f"join on {on!r}")


def join_function(table: GlobalTable, on: str | TableKeyOf, how: JoinHow, on_merge: OnMerge) -> Callable[[Any], Any]:
    """The join as a function of the value, named `join <table>`: the merged value, or DROPPED (an
    inner join's miss); what it raises is the record's failure (`steps.step_call` wraps it)."""
    merge = _merge_of(how, on_merge)
    key_of = table_key_of(on)

    def join(value: Any) -> Any:
        key = key_of(value)
        if key is None:
            raise ValueError("the table key is None")
        row = table.lookup(key)
        if row is None:
            return DROPPED if how == "inner" else value
        return merge(value, row)

    join.__name__ = f"join {table.name}"
    return join


def _merge_of(how: JoinHow, on_merge: OnMerge) -> Callable[[Any, Any], Any]:
    if how not in ("inner", "left"):
        raise ConfigurationError(f"join how= is 'inner' or 'left', got {how!r}")
    if not callable(on_merge) and on_merge not in ("raise", "keep-left", "keep-right"):
        raise ConfigurationError(
            f"join on_merge= is 'raise', 'keep-left', 'keep-right' or a function, got {on_merge!r}"
        )
    return on_merge if callable(on_merge) else _dict_merge(on_merge)


def _dict_merge(policy: str) -> Callable[[Any, Any], Any]:
    if policy == "keep-left":

        def keep_left(value: Any, row: Any) -> Any:
            if value.__class__ is not dict or row.__class__ is not dict:
                _refuse_unmergeable(value, row)
            return {**row, **value}

        return keep_left
    if policy == "keep-right":

        def keep_right(value: Any, row: Any) -> Any:
            if value.__class__ is not dict or row.__class__ is not dict:
                _refuse_unmergeable(value, row)
            return {**value, **row}

        return keep_right

    def refuse_both(value: Any, row: Any) -> Any:
        if value.__class__ is not dict or row.__class__ is not dict:
            _refuse_unmergeable(value, row)
        both = sorted(set(value) & set(row))
        if both:
            raise ValueError(
                f"the record and the table row both have fields {both}: choose on_merge='keep-left', "
                "'keep-right' or a function"
            )
        return {**value, **row}

    return refuse_both


def _refuse_unmergeable(value: Any, row: Any) -> None:
    """Raise unless both sides are dicts (of a subclass of dict too: the merge takes them as such)."""
    if not isinstance(value, dict) or not isinstance(row, dict):
        raise TypeError(
            f"merging needs dict values on both sides, got {type(value).__name__} and {type(row).__name__}: "
            "pass on_merge=a function (value, row) -> merged"
        )
