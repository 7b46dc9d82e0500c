"""A table of state rows made into a store's stored rows, each on the partition its key's messages reach.

Owns `encode_state_table`: the inverse of `state_table`'s decoding, for a bootstrap or a
migration. The table holds `key` (the message key, as the app's key serializer takes it),
`state_key` (text or bytes) and `value` (as the state serializer takes it), and may hold
`partition`. Every row is checked before anything is written: the columns, each key and value
through the serializers, no (key, state key) twice, and the partition, which the source's
partitioner decides (`kafka.partitioner`; a `partition` column must agree with it). A refusal names
the row, the key and what to do.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa

from dagster_stateful.core.kafka.partitioner import Partitioner, partition_of
from dagster_stateful.core.state.decoding import RowDecoder
from dagster_stateful.core.state.keys import encode_state_key, message_prefix
from dagster_stateful.errors import StateTableError

__all__ = ["REQUIRED_COLUMNS", "EncodedState", "encode_state_table"]

T = TypeVar("T")

REQUIRED_COLUMNS = ("key", "state_key", "value")


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
    table: pa.Table, decoder: RowDecoder, partitions: int, partitioner: Partitioner, what: str
) -> EncodedState:
    """The rows of `table` as `decoder`'s store keeps them, on `partitions` partitions.

    what: the table's description for errors (e.g. "the table bootstrapping store 'totals' of app 'x'").
    """
    if decoder.shape.is_window_store:
        raise StateTableError(
            f"{what}: store {decoder.shape.name!r} is a window store; only key-value and aggregation stores take "
            "state from a table"
        )
    missing = [name for name in REQUIRED_COLUMNS if name not in table.column_names]
    if missing:
        raise StateTableError(
            f"{what} lacks the columns {missing}: it needs {list(REQUIRED_COLUMNS)} (and may have `partition`); it "
            f"has {table.column_names}"
        )
    columns = {
        name: table.column(name).to_pylist() for name in (*REQUIRED_COLUMNS, "partition") if name in table.column_names
    }
    given_partitions = columns.get("partition")
    by_partition: dict[int, dict[bytes, bytes]] = {p: {} for p in range(partitions)}
    place = functools.partial(partition_of, partitions=partitions, partitioner=partitioner)
    for row, (key, state_key, value) in enumerate(
        zip(columns["key"], columns["state_key"], columns["value"], strict=True)
    ):
        key_bytes = _encoded(decoder.key_bytes, key, (what, row, key, "key", f"{decoder.key_serde.name} serializer"))
        state_key_bytes = _encoded(
            encode_state_key, state_key, (what, row, key, "state_key", "store's state keys (str or bytes)")
        )
        data = _encoded(
            decoder.state_serde.dumps, value, (what, row, key, "value", f"{decoder.state_serde.name} serializer")
        )
        store_key = message_prefix(key_bytes) + state_key_bytes
        partition = _encoded(place, key_bytes, (what, row, key, "key", f"{partitioner} partitioner"))
        if given_partitions is not None and given_partitions[row] != partition:
            raise StateTableError(
                f"{what}, row {row}: key {key!r} is in partition {given_partitions[row]} of the table, but the "
                f"source's partitioner ({partitioner}) sends its messages to partition {partition} of {partitions}; "
                "drop the `partition` column to place each key where its messages arrive, or pass the partitioner "
                "the source's producers use"
            )
        kept = by_partition[partition]
        if store_key in kept:
            raise StateTableError(f"{what}, row {row}: key {key!r} and state key {state_key!r} appear more than once")
        kept[store_key] = data
    return EncodedState({p: sorted(rows.items()) for p, rows in by_partition.items()})


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
