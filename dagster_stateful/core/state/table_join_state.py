"""The state of a join of two tables: per message key, the latest value of each side.

Owns `TableJoinState`, `TableJoinBounds` and the join store's layout. The join is Kafka Streams'
KTable-KTable join: the app's source and the joined stream are both read as tables (each record the
latest value of its key, a tombstone deleting it), and the join of a key holds when both sides have
a value (inner), when the left one has (left), or when either has (outer). Each side's latest value
is kept under a reserved key (`TABLE_JOIN_ROW + side + message prefix`), through the record cache
to the changelog, so that a restore brings both back. An update of either side that leaves the join
holding sends its new joined value; one that ends it sends a tombstone; one that neither makes nor
ends it sends nothing. Nothing expires: the store keeps what the tables keep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dagster_stateful.core.state.cache import StoreCache
from dagster_stateful.core.state.interval_join_state import LEFT, JoinedPair
from dagster_stateful.core.state.keys import RESERVED_PREFIX, STREAM_TIME_KEY
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.serialization import Serde
from dagster_stateful.core.state.window_state import WindowBounds, WindowState

__all__ = ["ENDED", "TABLE_JOIN_ROW", "TableJoinBounds", "TableJoinState"]

TABLE_JOIN_ROW = RESERVED_PREFIX + b"table-join-row"
ENDED: Any = object()
"""The value of a join result that ends the join of its key (a tombstone downstream)."""
NEVER = 2**62
"""The retention of a table join's rows: they live until a tombstone deletes them."""


@dataclass(frozen=True)
class TableJoinBounds(WindowBounds):
    """When a table join holds: `holds_when` is "inner" (both sides), "left" (the left side) or "outer" (either)."""

    holds_when: str = "inner"

    def holds(self, left: Any, right: Any) -> bool:
        if self.holds_when == "inner":
            return left is not None and right is not None
        if self.holds_when == "left":
            return left is not None
        return left is not None or right is not None


class TableJoinState(WindowState):
    """Both tables' latest values in one store partition, for the current message key (bound by the
    partition transaction)."""

    __slots__ = ("_tables", "right_offset")

    def __init__(self, partition: StorePartition, cache: StoreCache, serde: Serde, bounds: TableJoinBounds) -> None:
        self._tables = bounds
        self.right_offset = 0
        """The offset of the current right record in its topic (set before each; unused)."""
        super().__init__(partition, cache, serde, bounds)

    @property
    def expiries_due(self) -> bool:
        return self._idle_advanced

    def expire_committed(self, offset: int) -> None:
        return None

    @property
    def next_close(self) -> int | None:
        return None

    def update(self, starts: list[int], value: Any, first: Any, add: Any) -> Any:
        raise TypeError("a table join's store is changed with update_row")

    def update_row(self, side: int, value: Any) -> list[JoinedPair]:
        """Make `value` (None: deleted) the current key's latest value of `side`; returns what it
        sends: the key's new joined (left, right), or (left, ENDED) when the join of the key no
        longer holds, or nothing."""
        prefix = self._prefix
        left_key, right_key = _row_key(LEFT, prefix), _row_key(1 - LEFT, prefix)
        old_left, old_right = self._read(left_key), self._read(right_key)
        if side == LEFT:
            new_left, new_right = value, old_right
        else:
            new_left, new_right = old_left, value
        own_key = left_key if side == LEFT else right_key
        if value is None:
            self._cache.delete_live(own_key, self._offset)
        else:
            if not self._checked:
                self._serialize(own_key, value)  # a partition's first row: refused here, not at every commit
                self._checked = True
            self._cache.put_live(own_key, value, self._offset)
        self._metrics.folds += 1
        message_key = prefix[4:]
        if self._tables.holds(new_left, new_right):
            return [(message_key, new_left, new_right)]
        if self._tables.holds(old_left, old_right):
            return [(message_key, ENDED, None)]
        return []

    def _ensure_index(self) -> dict[int, set[bytes]]:
        if self._index is None:
            self._index = {}
            data = self._partition.get(STREAM_TIME_KEY)
            found = -1 if data is None else self._decode(data)
            self._stream_time = self._reconcile_stream_time(found)
        return self._index


def _row_key(side: int, prefix: bytes) -> bytes:
    return TABLE_JOIN_ROW + bytes((side,)) + prefix
