"""The table joins of `StreamingDataFrame`: `join` with a global or a partitioned table.

Owns `TableJoinDeclarations`, the mixin `StreamingDataFrame` takes `join` from: it checks what a
join with each kind of table allows (`dsl.joins` says how each runs) and adds its step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dagster_stateful.core.processing.dsl.joins import (
    GlobalTable,
    JoinHow,
    OnMerge,
    Table,
    TableKeyOf,
    join_function,
    table_join_function,
)
from dagster_stateful.core.processing.dsl.steps import Step, StepKind
from dagster_stateful.core.state.stores import Duration, as_ms
from dagster_stateful.errors import ConfigurationError

if TYPE_CHECKING:
    from dagster_stateful.core.processing.dsl.interval_joins import StreamJoin

__all__ = ["TableJoinDeclarations"]


class TableJoinDeclarations:
    """`join` with tables, for a frame that keeps the joins and adds their steps."""

    table_joins: dict[str, tuple[Table, int]]
    source_table_joins: dict[str, tuple[Table, int]]
    global_joins: list[str]
    stream_join: StreamJoin | None

    def join(
        self,
        table: GlobalTable | Table,
        *,
        on: str | TableKeyOf | None = None,
        how: JoinHow = "inner",
        on_merge: OnMerge = "raise",
        grace: Duration = 0,
    ):
        """Join each record with `table`, merging the table's row into the record (`on_merge`: "raise"
        on a field both have, "keep-left", "keep-right", or a function `(value, row) -> value`);
        how="inner" drops a record the table has no row for, "left" passes it on unchanged.

        With a global table (`App.global_table`, Kafka Streams' KStream-GlobalKTable join), `on` (a
        field of the value, or a function of it) is the table key, looked up in the table's latest
        values; the join keeps no state, so it may come before `group_by`.

        With a partitioned table (`App.table`, a KStream-KTable join), the record's message key is the
        table key: the source's key before `group_by` (the table co-partitioned with the source), the
        new key after it (co-partitioned with the repartition topic). A plain table gives its value
        when the record is processed, the partitions of both topics taken in timestamp order; a
        versioned table its value as of the record's timestamp, after the record waited `grace`
        (stream time, KIP-923; after `group_by` only) for table updates that arrive late."""
        if isinstance(table, Table):
            return self._join_table(table, on, how, on_merge, as_ms(grace, "join grace"))
        if not isinstance(table, GlobalTable):
            raise ConfigurationError(f"join needs a table from App.global_table(...) or App.table(...), got {table!r}")
        if on is None:
            raise ConfigurationError(f"a join with global table {table.name!r} needs on= a field or a function")
        if grace:
            raise ConfigurationError("grace= applies to a join with a versioned table (App.table(..., history=...))")
        self.global_joins.append(table.name)
        return self._append(Step(StepKind.JOIN, join_function(table, on, how, on_merge), None))

    def _join_table(self, table: Table, on: object, how: JoinHow, on_merge: OnMerge, grace_ms: int):
        if on is not None:
            raise ConfigurationError(
                f"table {table.name!r} is partitioned: it joins on the message key, not on={on!r}. Re-key the records "
                "by that field with group_by first, or join a global table (App.global_table) on it."
            )
        if grace_ms and not table.versioned:
            raise ConfigurationError(
                f"grace= needs a versioned table (App.table(..., history=...)): table {table.name!r} keeps only "
                "its latest values, which cannot answer for a record's timestamp once they changed"
            )
        if table.name in self.table_joins or table.name in self.source_table_joins:
            raise ConfigurationError(f"the steps already join table {table.name!r}; join each table once")
        if self.stream_join is not None:
            raise ConfigurationError("an app's steps join one stream, and then no partitioned table")
        if self.table_joins and grace_ms != next(iter(self.table_joins.values()))[1]:
            raise ConfigurationError("joins with several tables need the same grace= (a record waits once)")
        self._refuse_after_per_commit("a table join")
        self._refuse_after_windows("a table join")
        self.table_joins[table.name] = (table, grace_ms)
        return self._append(Step(StepKind.JOIN, table_join_function(table, how, on_merge), None))

    def _append(self, step: Step) -> Any:
        raise NotImplementedError

    def _refuse_after_per_commit(self, what: str) -> None:
        raise NotImplementedError

    def _refuse_after_windows(self, what: str) -> None:
        raise NotImplementedError
