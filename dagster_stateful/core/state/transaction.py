"""State as a step sees it, and the write cache of one partition between two commits.

Owns `State` (get / set / delete / exists, scoped to the current message key) and
`PartitionTransaction`: per store, the last value written to each key since the last commit
(repeated writes to a key cost one changelog record and one RocksDB put), plus the writes of the
message being processed, which are staged apart and merged only when the message succeeds, so a
step that fails half-way leaves no trace. Values are serialized by `State.set`, inside the step, so
a value the serializer refuses fails that message under the app's error policy instead of every
commit; the cache keeps bytes, and `State.get` returns a freshly deserialized object, so mutating
it in place changes nothing until it is `set`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from dagster_stateful.core.state.keys import encode_state_key, message_prefix
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.serialization import Serde
from dagster_stateful.errors import StateSerializationError, StateStoreError

Change = tuple[bytes, bytes | None, int]
"""A key's change since the last commit: (store key, serialized value or None for a delete, source offset)."""

_MISSING = object()


class State:
    """Key-value state of one store for the current message key only."""

    __slots__ = ("_cache", "_partition", "_prefix", "_serde", "_staged")

    def __init__(
        self,
        partition: StorePartition,
        cache: dict[bytes, tuple[bytes | None, int]],
        staged: dict[bytes, bytes | None],
        serde: Serde,
    ) -> None:
        self._partition = partition
        self._cache = cache
        self._staged = staged
        self._serde = serde
        self._prefix = b""

    def _bind(self, prefix: bytes) -> None:
        self._prefix = prefix

    def get(self, key: str | bytes, default: Any = None) -> Any:
        """A new object on every call: change it, then `set` it, for the change to count."""
        store_key = self._prefix + encode_state_key(key)
        data: bytes | None
        if store_key in self._staged:
            data = self._staged[store_key]
        else:
            entry = self._cache.get(store_key)
            data = self._partition.get(store_key) if entry is None else entry[0]
        return default if data is None else self._serde.loads(data)

    def set(self, key: str | bytes, value: Any) -> None:
        """Raises `StateSerializationError` (a failure of the step) when the serializer refuses `value`."""
        if value is None:
            raise ValueError("state values cannot be None; use state.delete(key)")
        self._staged[self._prefix + encode_state_key(key)] = self._dumps(key, value)

    def delete(self, key: str | bytes) -> None:
        self._staged[self._prefix + encode_state_key(key)] = None

    def exists(self, key: str | bytes) -> bool:
        return self.get(key, _MISSING) is not _MISSING

    def _dumps(self, key: str | bytes, value: Any) -> bytes:
        serde_name = getattr(self._serde, "name", type(self._serde).__name__)
        try:
            data = self._serde.dumps(value)
        except Exception as error:
            raise StateSerializationError(
                f"cannot store a {type(value).__name__} under state key {key!r} of store {self._partition.store!r}: "
                f"the {serde_name!r} state serializer refused it ({type(error).__name__}: {error}). Store values it "
                "can encode (for JSON: dict, list, str, int, float, bool), or give the app a state_serde that can."
            ) from error
        if isinstance(data, (bytearray, memoryview)):
            return bytes(data)
        if not isinstance(data, bytes):
            raise StateSerializationError(
                f"the {serde_name!r} state serializer returned {type(data).__name__}, not bytes, for state key "
                f"{key!r} of store {self._partition.store!r}; its dumps() must return bytes."
            )
        return data


class PartitionTransaction:
    """Uncommitted work on one source partition: state changes per store and the next offset."""

    def __init__(
        self, partition: int, stores: dict[str, StorePartition], serde: Serde, committed_offset: int | None
    ) -> None:
        self.partition = partition
        self.stores = stores
        self._caches: dict[str, dict[bytes, tuple[bytes | None, int]]] = {name: {} for name in stores}
        self._staged: dict[str, dict[bytes, bytes | None]] = {name: {} for name in stores}
        self.states = {name: State(stores[name], self._caches[name], self._staged[name], serde) for name in stores}
        self.next_offset: int | None = committed_offset
        """Offset of the next message to process on the source partition."""
        self.committed_offset = committed_offset
        self.processed = 0

    @property
    def has_progress(self) -> bool:
        return self.next_offset is not None and self.next_offset != self.committed_offset

    @property
    def offset_to_commit(self) -> int:
        """The source offset a commit records: the next message to process (only with progress)."""
        if self.next_offset is None:
            raise StateStoreError(f"partition {self.partition} has processed nothing: there is no offset to commit")
        return self.next_offset

    def begin_message(self, message_key: bytes) -> None:
        prefix = message_prefix(message_key)
        for state in self.states.values():
            state._bind(prefix)

    def accept_message(self, offset: int) -> None:
        """The message succeeded: its staged writes join the cache, tagged with its offset."""
        for name, staged in self._staged.items():
            if staged:
                cache = self._caches[name]
                for key, value in staged.items():
                    cache[key] = (value, offset)
                staged.clear()
        self.next_offset = offset + 1
        self.processed += 1

    def discard_message(self) -> None:
        for staged in self._staged.values():
            staged.clear()

    def pass_message(self, offset: int) -> None:
        """A message that was skipped or dead-lettered: it moves the offset but changes no state."""
        self.discard_message()
        self.next_offset = offset + 1
        self.processed += 1

    def changes(self, store: str) -> Iterator[Change]:
        """(key, serialized value or None for a delete, source offset), sorted by key."""
        cache = self._caches[store]
        for key in sorted(cache):
            data, offset = cache[key]
            yield key, data, offset

    def roll_back(self) -> None:
        """Drop every uncommitted change: the partition is processed again from `committed_offset`."""
        for cache in self._caches.values():
            cache.clear()
        self.discard_message()
        self.next_offset = self.committed_offset

    def committed(self) -> None:
        """Everything up to `next_offset` is durable: start a new transaction."""
        for cache in self._caches.values():
            cache.clear()
        self.committed_offset = self.next_offset
