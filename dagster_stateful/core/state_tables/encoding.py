"""A table of state rows made into a store's stored rows, each on the partition its key's messages reach.

Owns `encode_state_table`: the inverse of `state_table`'s decoding, for a bootstrap or a
migration. The table holds `key` (the message key, as the app's key serializer takes it),
`state_key` (text or bytes) and the value: a `value` column (as the state serializer takes it),
or one column per field of a JSON object, as `state_table` lays values out. It may hold
`partition` and, for an expiring store, `expires_at`. Every row is checked before anything is
written: the columns, each key and value through the serializers, no (key, state key) twice, and
the partition, which the source's partitioner decides (`kafka.partitioner`; a `partition` column
must agree with it) unless the table's own partitions are to be kept. A refusal names the row, the
key and what to do.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
import pyarrow as pa

from dagster_stateful.core.kafka.partitioner import Partitioner, partition_of
from dagster_stateful.core.state.decoding import RowDecoder
from dagster_stateful.core.state.keys import encode_state_key, message_prefix
from dagster_stateful.core.state.ttl import with_expiry
from dagster_stateful.errors import StateTableError

__all__ = ["ROW_COLUMNS", "EncodedState", "encode_state_table", "values_of"]

T = TypeVar("T")

ROW_COLUMNS = frozenset({"partition", "key", "state_key", "expires_at", "window_start", "window_end", "value"})
"""The columns of a state table that are not fields of its values."""


@dataclass(frozen=True)
class EncodedState:
    """Stored rows per partition, each partition's sorted by store key (as RocksDB and snapshots keep them)."""

    rows: Mapping[int, list[tuple[bytes, bytes]]]

    @property
    def row_count(self) -> int:
        return sum(len(rows) for rows in self.rows.values())

    def keys(self, partition: int) -> set[bytes]:
        return {key for key, _ in self.rows.get(partition, ())}


def encode_state_table(
    table: pa.Table,
    decoder: RowDecoder,
    partitions: int,
    partitioner: Partitioner | None,
    what: str,
    json_text: bool = False,
) -> EncodedState:
    """The rows of `table` as `decoder`'s store keeps them, on `partitions` partitions.

    partitioner: places each key (a `partition` column must agree); None: the table's `partition`
        column places them (the rows of a snapshot read as a table, where the messages put them).
    what: the table's description for errors (e.g. "the table bootstrapping store 'totals'").
    json_text: a text `value` column holds each value's JSON text (a table decoded that way).
    """
    if decoder.shape.is_window_store:
        raise StateTableError(
            f"{what}: store {decoder.shape.name!r} is a window store; only key-value and aggregation stores take "
            "state from a table"
        )
    missing = [name for name in ("key", "state_key") if name not in table.column_names]
    if partitioner is None and "partition" not in table.column_names:
        missing.append("partition")
    if missing:
        raise StateTableError(
            f"{what} lacks the columns {missing}: it needs `key`, `state_key` and the value (a `value` column, or "
            f"one column per field of a JSON object), and may have `partition` and `expires_at`; it has "
            f"{table.column_names}"
        )
    keys, state_keys = table.column("key").to_pylist(), table.column("state_key").to_pylist()
    values = values_of(table, what, json_text)
    given = table.column("partition").to_pylist() if "partition" in table.column_names else None
    expiries = _expiries(table, decoder)
    by_partition: dict[int, dict[bytes, bytes]] = {p: {} for p in range(partitions)}
    place = (
        None if partitioner is None else functools.partial(partition_of, partitions=partitions, partitioner=partitioner)
    )
    for row, (key, state_key, value) in enumerate(zip(keys, state_keys, values, strict=True)):
        key_bytes = _encoded(decoder.key_bytes, key, (what, row, key, "key", f"{decoder.key_serde.name} serializer"))
        state_key_bytes = _encoded(
            encode_state_key, state_key, (what, row, key, "state_key", "store's state keys (str or bytes)")
        )
        data = _encoded(
            decoder.state_serde.dumps, value, (what, row, key, "value", f"{decoder.state_serde.name} serializer")
        )
        expiry = None if expiries is None else expiries[row]
        if expiry is not None:
            data = with_expiry(expiry, data)
        partition = _partition(key, row, given, place, key_bytes, partitions, what, partitioner)
        store_key = message_prefix(key_bytes) + state_key_bytes
        kept = by_partition[partition]
        if store_key in kept:
            raise StateTableError(f"{what}, row {row}: key {key!r} and state key {state_key!r} appear more than once")
        kept[store_key] = data
    return EncodedState({p: sorted(rows.items()) for p, rows in by_partition.items()})


def values_of(table: pa.Table, what: str, json_text: bool = False) -> list[Any]:
    """Each row's value: its `value` column, else a JSON object of its field columns (every column
    but the keys', `value_<name>` for a field named like one; a null field is left out)."""
    if "value" in table.column_names:
        values = table.column("value").to_pylist()
        if json_text and pa.types.is_string(table.schema.field("value").type):
            return [None if text is None else orjson.loads(text) for text in values]
        return values
    fields = [name for name in table.column_names if name not in ROW_COLUMNS]
    if not fields:
        raise StateTableError(f"{what} has no value: give a `value` column, or one column per field of the values")
    named = {
        name: name.removeprefix("value_") if name.removeprefix("value_") in ROW_COLUMNS else name for name in fields
    }
    columns = {named[name]: table.column(name).to_pylist() for name in fields}
    return [
        {field: column[row] for field, column in columns.items() if column[row] is not None}
        for row in range(table.num_rows)
    ]


def _expiries(table: pa.Table, decoder: RowDecoder) -> list[int | None] | None:
    if decoder.shape.ttl is None or "expires_at" not in table.column_names:
        return None
    return table.column("expires_at").to_pylist()


def _partition(
    key: Any,
    row: int,
    given: list[Any] | None,
    place: Callable[[bytes], int] | None,
    key_bytes: bytes,
    partitions: int,
    what: str,
    partitioner: Partitioner | None,
) -> int:
    if place is None:
        assert given is not None
        partition = given[row]
        if not isinstance(partition, int) or not 0 <= partition < partitions:
            raise StateTableError(
                f"{what}, row {row} (key {key!r}): partition {partition!r} is not one of 0-{partitions - 1}"
            )
        return partition
    partition = _encoded(place, key_bytes, (what, row, key, "key", f"{partitioner} partitioner"))
    if given is not None and given[row] != partition:
        raise StateTableError(
            f"{what}, row {row}: key {key!r} is in partition {given[row]} of the table, but the source's partitioner "
            f"({partitioner}) sends its messages to partition {partition} of {partitions}; drop the `partition` "
            "column to place each key where its messages arrive, or pass the partitioner the source's producers use"
        )
    return partition


def _encoded(encode: Callable[[Any], T], item: Any, where: tuple[str, int, Any, str, str]) -> T:
    """`encode(item)`; where: (what, row, key, column, serializer), for the refusal."""
    try:
        return encode(item)
    except (TypeError, ValueError, OverflowError) as error:
        what, row, key, column, serializer = where
        raise StateTableError(
            f"{what}, row {row} (key {key!r}): the {column} does not fit the {serializer} ({error}); give "
            f"{column}s as the app's serializers take them, on the partitioner the source's producers use"
        ) from None
