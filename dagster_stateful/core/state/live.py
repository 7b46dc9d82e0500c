"""The state of an aggregation: aggregates kept as live objects between commits.

Owns `LiveState`, what an aggregation step of `StreamingDataFrame.aggregate` folds messages into:
per message key, one aggregate per aggregation name, held in a live `cache.StoreCache` as the
object the aggregator returned. A message costs a dictionary look-up and the aggregator's call;
the state serializer runs once per key and commit (`StoreCache.changes`), and the deserializer
only for a key the cache does not hold. Writes are journaled like `State`'s, so a message that
fails in a later step leaves no trace. A vectorized batch merges one partial per key at once
(`merge_partials`), reading the keys the cache misses with one RocksDB multi-get. Each fold is
counted in the partition's metrics, and timed on sampled messages (`TIMED_OPERATIONS`, see
`view.timed_variant`).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat
from typing import Any

from dagster_stateful.core.state.cache import StoreCache
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.serialization import Serde
from dagster_stateful.core.state.view import KeyView

__all__ = ["TIMED_OPERATIONS", "LiveState", "PartialsRefused"]

_MISSING: Any = object()

TIMED_OPERATIONS = {"_fold_key": "fold"}
"""`LiveState`'s methods timed on sampled messages, with the operation each one is."""


class PartialsRefused(Exception):
    """A batch's partials could not be merged (a stored aggregate the serde or the merge refuses);
    nothing was kept, and the batch goes message by message, where the error policy sees each failure."""


class LiveState(KeyView):
    """The aggregates of one store for the current message key (bound by the partition transaction)."""

    __slots__ = ("_checked", "_serialize")

    def __init__(self, partition: StorePartition, cache: StoreCache, serde: Serde) -> None:
        """`cache` must be live (made with a `LiveSerializer`)."""
        super().__init__(partition, cache, serde)
        if cache.serialize is None:
            raise ValueError(f"the aggregations of store {partition.store!r} need a live record cache")
        self._serialize = cache.serialize
        self._checked = False

    def fold(self, suffix: bytes, value: Any, first: Callable[[Any], Any], add: Callable[[Any, Any], Any]) -> Any:
        """The aggregate under state key `suffix` after `value`: `first(value)` for a key without
        one, else `add(aggregate, value)`; kept (journaled) and returned."""
        return self._fold_key(self._prefix + suffix, value, first, add)

    def _fold_key(self, key: bytes, value: Any, first: Callable[[Any], Any], add: Callable[[Any, Any], Any]) -> Any:
        """`fold` under store key `key`."""
        self._metrics.folds += 1
        current = self._values.get(key, _MISSING)
        if current is _MISSING:
            self._metrics.misses += 1
            current = self._load(key)
        aggregate = first(value) if current is None else add(current, value)
        if aggregate is None:
            raise ValueError("the aggregator returned None; an aggregate must be a value the state serializer encodes")
        if not self._checked:
            self._serialize(key, aggregate)  # a partition's first aggregate: refused here, not at every commit
            self._checked = True
        self._cache.put_live(key, aggregate, self._offset)
        return aggregate

    def merge_partials(
        self,
        keys: list[bytes],
        partials: list[Any],
        offsets: list[int],
        merge: Callable[[Any, Any], Any],
        folded: int,
        journaled: bool = False,
    ) -> None:
        """Fold each store key's partial of a batch (its aggregate when the key has none) into its
        aggregate, tagged with the offset of the key's last message; `folded` messages made them.
        All or nothing: raises `PartialsRefused` before keeping anything (the read values stay cached).
        `journaled`: the writes are journaled as one message's, to be accepted or undone."""
        current = list(map(self._values.get, keys, repeat(_MISSING)))
        missing = []
        if _MISSING in current:
            missing = [key for key, value in zip(keys, current, strict=True) if value is _MISSING]
        metrics = self._metrics
        metrics.folds += folded
        metrics.misses += len(missing)
        found = self._partition.get_many(missing) if missing else []  # a damaged store raises here, as itself
        try:
            if missing:
                loaded = self._remember_loaded(missing, found)
                current = [
                    loaded[key] if value is _MISSING else value for key, value in zip(keys, current, strict=True)
                ]
            new_keys = current.count(None)
            if new_keys:
                merged = [
                    partial if value is None else merge(value, partial)
                    for value, partial in zip(current, partials, strict=True)
                ]
            else:
                merged = list(map(merge, current, partials))
            if not self._checked and merged:
                self._serialize(keys[0], merged[0])
                self._checked = True
        except Exception as error:
            raise PartialsRefused(f"{type(error).__name__}: {error}") from error
        self._cache.put_live_batch(keys, merged, offsets, new_keys, journaled)

    def _remember_loaded(self, keys: list[bytes], found: list[bytes | None]) -> dict[bytes, Any]:
        """The stored aggregates of `keys` (None where absent), decoded and cached as clean."""
        decode = self._decode
        values: list[Any] = found
        if found.count(None) != len(found):
            values = [None if data is None else decode(data) for data in found]
        self._cache.remember_live_batch(keys, values)
        return dict(zip(keys, values, strict=True))

    def _load(self, key: bytes) -> Any:
        data = self._partition.get(key)
        current = None if data is None else self._decode(data)
        self._cache.remember(key, current)
        return current
