"""The state of a foreign-key join: per message key, the left table's latest value and the key it references.

Owns `ForeignKeyJoinState`, `ForeignKeyJoinBounds` and the store's layout. The join is Kafka Streams'
foreign-key KTable-KTable join: the app's source is read as a table (the left one), each value
naming a key of another table (the right one, a global table every worker keeps whole), and the
join of a left key holds when the right table has a value for the key it names (inner), or
whenever the left key has a value (left). Each left row is kept under a reserved key
(`FOREIGN_KEY_ROW + message prefix`) as `[value, foreign key, holds]`, through the record cache to
the changelog, so that a restore brings it back; `holds` says whether what the key last sent was a
joined value (so that a change that ends the join sends one tombstone, and one that neither made
nor ended it sends nothing). Which left keys reference each right key is indexed in memory (read
from RocksDB and the record cache when first needed, and again after a roll-back), so that an
update of the right table finds the rows it changes. Nothing expires: the store keeps what the
left table keeps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dagster_stateful.core.state.cache import StoreCache
from dagster_stateful.core.state.interval_join_state import JoinedPair
from dagster_stateful.core.state.keys import RESERVED_PREFIX
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.serialization import Serde
from dagster_stateful.core.state.table_join_state import ENDED, TableJoinBounds, TableJoinState

__all__ = ["FOREIGN_KEY_ROW", "ForeignKeyJoinBounds", "ForeignKeyJoinState"]

FOREIGN_KEY_ROW = RESERVED_PREFIX + b"foreign-key-row"


@dataclass(frozen=True)
class ForeignKeyJoinBounds(TableJoinBounds):
    """A foreign-key join: `holds_when` is "inner" or "left"; `right_key_bytes` encodes a foreign key
    as the right table's message keys are (the index is keyed by those bytes)."""

    right_key_bytes: Callable[[Any], bytes] = bytes


class ForeignKeyJoinState(TableJoinState):
    """The left rows of a foreign-key join in one store partition, for the current message key
    (bound by the partition transaction), and which rows each right key is referenced by."""

    __slots__ = ("_foreign", "_referenced")

    def __init__(
        self, partition: StorePartition, cache: StoreCache, serde: Serde, bounds: ForeignKeyJoinBounds
    ) -> None:
        self._foreign = bounds
        super().__init__(partition, cache, serde, bounds)

    def forget(self) -> None:
        super().forget()
        self._referenced: dict[bytes, set[bytes]] | None = None
        """Right key (as bytes) -> the message prefixes of the left rows that reference it."""

    @property
    def references(self) -> int:
        """How many left rows reference a right key."""
        return sum(len(prefixes) for prefixes in self._ensure_references().values())

    def update_left(self, value: Any, foreign_key: Any, right_of: Callable[[Any], Any]) -> list[JoinedPair]:
        """Make `value` (None: deleted) the current key's left row, referencing `foreign_key`, whose
        right value `right_of` gives (None: the right table has none). Returns what it sends: the
        key's new (left, right), or (ENDED, None) when its join no longer holds, or nothing."""
        referenced = self._ensure_references()
        prefix = self._prefix
        row_key = FOREIGN_KEY_ROW + prefix
        old = self._read(row_key)
        if old is not None and old[1] is not None:
            previous = referenced.get(self._foreign.right_key_bytes(old[1]))
            if previous is not None:
                previous.discard(prefix)
        self._metrics.folds += 1
        if value is None:
            if old is not None:
                self._cache.delete_live(row_key, self._offset)
            return [(prefix[4:], ENDED, None)] if old is not None and old[2] else []
        right = right_of(foreign_key)
        if foreign_key is not None:  # a left join's row without a foreign key references nothing
            referenced.setdefault(self._foreign.right_key_bytes(foreign_key), set()).add(prefix)
        return self._set_row(prefix, value, foreign_key, right, old is not None and bool(old[2]))

    def update_right(self, right_key: bytes, right: Any) -> list[JoinedPair]:
        """The right table's value for `right_key` (its message key's bytes) is now `right` (None:
        deleted): what each left row that references it sends."""
        sent: list[JoinedPair] = []
        for prefix in sorted(self._ensure_references().get(right_key, ())):
            stored = self._read(FOREIGN_KEY_ROW + prefix)
            if stored is None:
                continue
            sent += self._set_row(prefix, stored[0], stored[1], right, bool(stored[2]))
        return sent

    def _set_row(self, prefix: bytes, value: Any, foreign_key: Any, right: Any, held: bool) -> list[JoinedPair]:
        holds = self._tables.holds(value, right)
        row = [value, foreign_key, holds]
        if not self._checked:
            self._serialize(FOREIGN_KEY_ROW + prefix, row)  # a partition's first row: refused here, not at a commit
            self._checked = True
        self._cache.put_live(FOREIGN_KEY_ROW + prefix, row, self._offset)
        if holds:
            return [(prefix[4:], value, right)]
        return [(prefix[4:], ENDED, None)] if held else []

    def _ensure_references(self) -> dict[bytes, set[bytes]]:
        """The index of left rows by the right key they reference, when not known: the rows in
        RocksDB, as the record cache has changed them since the last commit."""
        if self._referenced is not None:
            return self._referenced
        self._ensure_index()
        rows: dict[bytes, Any] = {}
        for key, data in self._partition.items(FOREIGN_KEY_ROW):
            if not key.startswith(FOREIGN_KEY_ROW):
                break
            rows[key] = data
        for key, value in self._values.items():
            if key.startswith(FOREIGN_KEY_ROW):
                rows[key] = value
        referenced: dict[bytes, set[bytes]] = {}
        encode = self._foreign.right_key_bytes
        for key, stored in rows.items():
            if stored is None:
                continue
            row = self._decode(stored) if isinstance(stored, bytes) else stored
            if row[1] is None:
                continue
            referenced.setdefault(encode(row[1]), set()).add(key[len(FOREIGN_KEY_ROW) :])
        self._referenced = referenced
        return referenced
