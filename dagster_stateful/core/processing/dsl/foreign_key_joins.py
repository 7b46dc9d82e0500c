"""Foreign-key joins of two tables: what `table_join(global_table, on=...)` declares, and how its steps run.

Owns `ForeignKeyJoin` (the definition: the right table, the foreign key of a left value, inner or
left) and its two calls, Kafka Streams' foreign-key `KTable.join(other, foreignKeyExtractor,
joiner)`: the app's source is read as a table (the left one, a tombstone deleting its key), each
value naming by `on` (a field, or a function of the value) a key of the right table, a global table
(`App.global_table`) every worker keeps whole, so that the two topics need no co-partitioning. An
update of a left key passes on its new joined value (merged by `on_merge`, a function given None for
a missing right value; a left join's value without a foreign key joins no right value, as in Kafka
Streams since KIP-962) or `ENDED` (a tombstone) when its join no longer holds; an update of a right
key does the same for every left key that references it (`worker.foreign_key_joins` runs those,
then the steps after the join). See `state.foreign_key_join_state` for when the join holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from dagster_stateful.core.processing.dsl.interval_joins import PairMerge, SideCall, join_side_calls, pair_merge
from dagster_stateful.core.processing.dsl.joins import GlobalTable, TableKeyOf, table_key_of
from dagster_stateful.core.processing.dsl.windows import Emitted
from dagster_stateful.core.state.foreign_key_join_state import ForeignKeyJoinBounds, ForeignKeyJoinState
from dagster_stateful.core.state.interval_join_state import LEFT, JoinedPair
from dagster_stateful.core.state.table_join_state import ENDED, NEVER
from dagster_stateful.errors import ConfigurationError

__all__ = ["ForeignKeyJoin", "ForeignKeyJoinHow", "RightUpdate", "foreign_key_join_calls"]

ForeignKeyJoinHow = Literal["inner", "left"]
RightUpdate = tuple[bytes, Any]
"""What the right call takes: a right key (its message key's bytes) and its new value (None: deleted)."""


@dataclass(frozen=True)
class ForeignKeyJoin:
    """The join of the app's table with `table` on the key `on` finds in each left value."""

    table: GlobalTable
    on: TableKeyOf
    how: ForeignKeyJoinHow

    kind = "foreign-key join"
    size = 0
    stream = None
    """A foreign-key join reads no joined stream: its right side is a global table."""

    @classmethod
    def define(cls, table: GlobalTable, on: object, how: str) -> ForeignKeyJoin:
        if on is None:
            raise ConfigurationError(
                f"table_join with global table {table.name!r} is a foreign-key join: it needs on= the field of the "
                "left value (or a function of it) that holds the right table's key"
            )
        if how not in ("inner", "left"):
            raise ConfigurationError(f"a foreign-key join's how= is 'inner' or 'left' (as Kafka Streams'), got {how!r}")
        return cls(table, table_key_of(on), how)  # type: ignore[arg-type]  # checked: a str or a function

    @property
    def bounds(self) -> ForeignKeyJoinBounds:
        return ForeignKeyJoinBounds(0, 0, NEVER, self.how, right_key_bytes=self.table.key_serde.dumps)

    def changelog_config(self) -> dict[str, str]:
        return {"cleanup.policy": "compact"}


def foreign_key_join_calls(
    store: str, name: str, join: ForeignKeyJoin, on_merge: PairMerge
) -> tuple[SideCall, SideCall]:
    """The calls for an update of the left table (a record of the app's source) and of the right one
    (a `RightUpdate`): what each left key it changes sends (`join_side_calls`)."""
    merge = pair_merge(on_merge)
    key_of, lookup, left_join = join.on, join.table.lookup, join.how == "left"

    def right_of(foreign_key: Any) -> Any:
        return None if foreign_key is None else lookup(foreign_key)

    def merged(updated: list[JoinedPair]) -> Emitted:
        return Emitted([(key, left if left is ENDED else merge(left, right)) for key, left, right in updated])

    def results(state: ForeignKeyJoinState, side: int, value: Any) -> Emitted:
        if side != LEFT:
            right_key, right = value
            return merged(state.update_right(right_key, right))
        foreign_key = None if value is None else key_of(value)
        if value is not None and foreign_key is None and not left_join:
            raise ValueError(
                "the foreign key is None: a left value of an inner join must name a key of the right table"
            )
        return merged(state.update_left(value, foreign_key, right_of))

    return join_side_calls(store, name, results)
