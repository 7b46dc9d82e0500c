"""What the state views a step gets have in common: one store partition, scoped to the current key.

Owns `KeyView`, the base of `kv.State` (key-value state) and `live.LiveState` (the
aggregations' state): the store partition, its record cache, the state serializer's decoding, and
the current message's key prefix and source offset, which the partition transaction binds before
each message (`_bind`).
"""

from __future__ import annotations

from typing import Any

from dagster_stateful.core.state.cache import StoreCache
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.serialization import Serde, fast_loads

__all__ = ["KeyView"]


class KeyView:
    """One store partition's state, seen through its record cache, for the current message key."""

    __slots__ = ("_cache", "_loads", "_offset", "_partition", "_prefix", "_serde", "_values")

    def __init__(self, partition: StorePartition, cache: StoreCache, serde: Serde) -> None:
        self._partition = partition
        self._cache = cache
        self._values = cache.values
        self._serde = serde
        self._loads = fast_loads(serde)
        self._prefix = b""
        self._offset = -1

    def _bind(self, prefix: bytes, offset: int) -> None:
        self._prefix = prefix
        self._offset = offset

    def _decode(self, data: bytes) -> Any:
        """`data` deserialized; what the serde refuses is raised by its own `loads`, described."""
        try:
            return self._loads(data)
        except Exception:  # noqa: BLE001 - the serde's own loads raises it, described
            return self._serde.loads(data)
