"""Joins of two tables: what `StreamingDataFrame.table_join` declares, and how its steps run.

Owns `TableTableJoin` (the definition: inner, left or outer) and its two calls, Kafka Streams'
KTable-KTable join: the app's source and the joined stream (`App.stream`, co-partitioned, keyed
alike) are both read as tables, each record the latest value of its key and a tombstone (a record
without a value) deleting it. An update on either side passes on the key's new joined value,
merged by `on_merge` ("raise", "keep-left", "keep-right" or a function `(left, right) -> value`
given None for a missing side), or `ENDED` (a tombstone in the output topic) when the join of the
key no longer holds (see `state.table_join_state`). The joined stream's records run through the
right call and the steps after the join as an interval join's do (`worker.joined_streams`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Self

from dagster_stateful.core.processing.dsl.foreign_key_joins import ForeignKeyJoin, foreign_key_join_calls
from dagster_stateful.core.processing.dsl.interval_joins import (
    JoinedStream,
    PairMerge,
    SideCall,
    join_side_calls,
    pair_merge,
)
from dagster_stateful.core.processing.dsl.joins import GlobalTable, TableKeyOf
from dagster_stateful.core.processing.dsl.windows import Emitted
from dagster_stateful.core.state.table_join_state import ENDED, NEVER, TableJoinBounds, TableJoinState
from dagster_stateful.errors import ConfigurationError

__all__ = ["TableTableJoin", "TableTableJoinDeclarations", "TableTableJoinHow", "table_join_calls"]

TableTableJoinHow = Literal["inner", "left", "outer"]


@dataclass(frozen=True)
class TableTableJoin:
    """The join of the app's table with `stream`'s, on the message key."""

    stream: JoinedStream
    how: TableTableJoinHow

    kind = "table join"
    size = 0

    @classmethod
    def define(cls, stream: JoinedStream, how: TableTableJoinHow) -> TableTableJoin:
        if not isinstance(stream, JoinedStream):
            raise ConfigurationError(f"table_join needs a table's topic from App.stream(...), got {stream!r}")
        if how not in ("inner", "left", "outer"):
            raise ConfigurationError(f"table_join how= is 'inner', 'left' or 'outer', got {how!r}")
        return cls(stream, how)

    @property
    def bounds(self) -> TableJoinBounds:
        return TableJoinBounds(0, 0, NEVER, self.how)

    def changelog_config(self) -> dict[str, str]:
        return {"cleanup.policy": "compact"}


def table_join_calls(store: str, name: str, on_merge: PairMerge) -> tuple[SideCall, SideCall]:
    """The table join's calls for an update of the left table (the app's) and of the right one
    (`join_side_calls`): the key's new joined value, or `ENDED`."""
    merge = pair_merge(on_merge)

    def results(state: TableJoinState, side: int, value: Any) -> Emitted:
        updated = state.update_row(side, value)
        return Emitted([(key, left if left is ENDED else merge(left, right)) for key, left, right in updated])

    return join_side_calls(store, name, results)


class TableTableJoinDeclarations:
    """`table_join`, for a frame that adds its step (`_add_stream_join`)."""

    def table_join(
        self,
        other: JoinedStream | GlobalTable,
        *,
        on: str | TableKeyOf | None = None,
        how: TableTableJoinHow = "inner",
        on_merge: PairMerge = "raise",
        store: str | None = None,
    ) -> Self:
        """Read the app's source and `other` (`App.stream` of a compacted topic, co-partitioned with
        the source, keyed alike) as tables and join them on the key, Kafka Streams'
        `KTable.join(otherTable, joiner)` (`leftJoin`, `outerJoin`): every update of either side
        passes on the key's new joined value (merged by `on_merge`; a function gets None for a missing
        side), or a tombstone when the join of the key no longer holds (inner: both sides have a
        value; left: the left side has; outer: either has). A record without a value deletes its
        key's side. Both sides' latest values are kept in `store` (the app's only store unless named;
        no other step may use it), compacted in its changelog. Only stateless steps may follow; a
        tombstone passes them by.

        With a global table (`App.global_table`) and `on` (a field of the left value, or a function of
        it), the join is Kafka Streams' foreign-key join (`KTable.join(other, foreignKeyExtractor,
        joiner)`, how "inner" or "left"): each left value names the right key it joins, the topics
        need no co-partitioning, and an update of a right key passes on the new joined value of every
        left key that references it (see `dsl.foreign_key_joins`)."""
        if isinstance(other, GlobalTable):
            foreign = ForeignKeyJoin.define(other, on, how)
            name = f"join table {other.name}"
            left, right = foreign_key_join_calls(self._join_store(store), name, foreign, on_merge)
            return self._add_stream_join(foreign, left, right, name, store)
        if on is not None:
            raise ConfigurationError(
                f"table_join with stream {getattr(other, 'name', other)!r} joins on the message key, not on={on!r}: "
                "a foreign-key join needs the right table as App.global_table(...)"
            )
        join = TableTableJoin.define(other, how)
        name = f"join table {other.name}"
        left, right = table_join_calls(self._join_store(store), name, on_merge)
        return self._add_stream_join(join, left, right, name, store)

    def _join_store(self, store: str | None) -> str:
        raise NotImplementedError

    def _add_stream_join(self, join: Any, left: SideCall, right: SideCall, name: str, store: str | None) -> Self:
        raise NotImplementedError
