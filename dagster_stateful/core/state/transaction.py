"""State as a step sees it, and the uncommitted work of one partition between two commits.

Owns `State` (get / set / delete / exists, scoped to the current message key) and
`PartitionTransaction`: per store, a record cache (`cache.StoreCache`) holding the last value
written to each key since the last commit (repeated writes to a key cost one changelog record and
one RocksDB put) and the values read or committed lately. The writes of the message being processed
are journaled and undone if it fails, so a step that fails half-way leaves no trace. Values are
serialized by `State.set`, inside the step, so a value the serializer refuses fails that message
under the app's error policy instead of every commit; the cache keeps bytes, and `State.get`
returns a freshly deserialized object, so mutating it in place changes nothing until it is `set`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster_stateful.core.state.cache import Change, StoreCache
from dagster_stateful.core.state.keys import encode_state_key, message_prefix
from dagster_stateful.core.state.live import LiveState, live_serializer
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.serialization import Serde, fast_dumps
from dagster_stateful.core.state.view import KeyView
from dagster_stateful.core.state.windows import WindowBounds, WindowState
from dagster_stateful.errors import StateSerializationError, StateStoreError

__all__ = ["Change", "PartitionTransaction", "State"]

_MISSING: Any = object()


class State(KeyView):
    """Key-value state of one store for the current message key only."""

    __slots__ = ("_dumps",)

    def __init__(self, partition: StorePartition, cache: StoreCache, serde: Serde) -> None:
        super().__init__(partition, cache, serde)
        self._dumps = fast_dumps(serde)

    def get(self, key: str | bytes, default: Any = None) -> Any:
        """A new object on every call: change it, then `set` it, for the change to count."""
        store_key = self._prefix + (key.encode() if key.__class__ is str else encode_state_key(key))
        data = self._values.get(store_key, _MISSING)
        if data is _MISSING:
            data = self._partition.get(store_key)
            self._cache.remember(store_key, data)
        if data is None:
            return default
        try:
            return self._loads(data)
        except Exception:  # noqa: BLE001 - the serde's own loads raises it, described
            return self._serde.loads(data)

    def set(self, key: str | bytes, value: Any) -> None:
        """Raises `StateSerializationError` (a failure of the step) when the serializer refuses `value`."""
        if value is None:
            raise ValueError("state values cannot be None; use state.delete(key)")
        store_key = self._prefix + (key.encode() if key.__class__ is str else encode_state_key(key))
        try:
            data = self._dumps(value)
        except Exception as error:
            raise self._refused(key, value, error) from error
        self._cache.put(store_key, data if data.__class__ is bytes else self._as_bytes(key, data), self._offset)

    def delete(self, key: str | bytes) -> None:
        self._cache.put(self._prefix + encode_state_key(key), None, self._offset)

    def exists(self, key: str | bytes) -> bool:
        return self.get(key, _MISSING) is not _MISSING

    def _serde_name(self) -> str:
        return getattr(self._serde, "name", type(self._serde).__name__)

    def _refused(self, key: str | bytes, value: Any, error: Exception) -> StateSerializationError:
        return StateSerializationError(
            f"cannot store a {type(value).__name__} under state key {key!r} of store {self._partition.store!r}: "
            f"the {self._serde_name()!r} state serializer refused it ({type(error).__name__}: {error}). Store values "
            "it can encode (for JSON: dict, list, str, int, float, bool), or give the app a state_serde that can."
        )

    def _as_bytes(self, key: str | bytes, data: object) -> bytes:
        if isinstance(data, (bytes, bytearray, memoryview)):
            return bytes(data)
        raise StateSerializationError(
            f"the {self._serde_name()!r} state serializer returned {type(data).__name__}, not bytes, for state key "
            f"{key!r} of store {self._partition.store!r}; its dumps() must return bytes."
        )


class PartitionTransaction:
    """Uncommitted work on one source partition: state changes per store and the next offset.

    Per message: `begin_message`, the steps, then `accept_message` (its writes stay) or
    `discard_message` / `pass_message` (they are undone)."""

    def __init__(
        self,
        partition: int,
        stores: dict[str, StorePartition],
        serde: Serde,
        committed_offset: int | None,
        live_stores: Mapping[str, WindowBounds | None] | None = None,
    ) -> None:
        """live_stores: the stores of aggregations, whose steps get a `live.LiveState` instead of a
        `State`, or, with the bounds of their windows, a `windows.WindowState`."""
        live_stores = live_stores or {}
        self.partition = partition
        self.stores = stores
        self.caches = {
            name: StoreCache(live_serializer(name, serde) if name in live_stores else None) for name in stores
        }
        self.states = {
            name: State(stores[name], self.caches[name], serde) for name in stores if name not in live_stores
        }
        """The key-value stores' state, as stateful steps see it."""
        self.live = {
            name: LiveState(stores[name], self.caches[name], serde)
            for name, bounds in live_stores.items()
            if name in stores and bounds is None
        }
        """The keyed aggregations' stores."""
        self.windows = {
            name: WindowState(stores[name], self.caches[name], serde, bounds)
            for name, bounds in live_stores.items()
            if name in stores and bounds is not None
        }
        """The windowed aggregations' stores."""
        self.views: dict[str, State | LiveState | WindowState] = {**self.states, **self.live, **self.windows}
        """Every store, by name: what the steps get."""
        self.window_list = list(self.windows.values())
        self._state_list = list(self.views.values())
        self._cache_list = list(self.caches.values())
        self.journals = [cache.journal for cache in self._cache_list]
        """The current message's writes, per store (see `accept_message`)."""
        self.next_offset: int | None = committed_offset
        """Offset of the next message to process on the source partition."""
        self.committed_offset = committed_offset

    @property
    def has_progress(self) -> bool:
        return self.next_offset is not None and self.next_offset != self.committed_offset

    @property
    def offset_to_commit(self) -> int:
        """The source offset a commit records: the next message to process (only with progress)."""
        if self.next_offset is None:
            raise StateStoreError(f"partition {self.partition} has processed nothing: there is no offset to commit")
        return self.next_offset

    @property
    def cached_bytes(self) -> int:
        """Bytes held by this partition's record caches (see `cache.StoreCache`)."""
        return sum(cache.bytes for cache in self.caches.values())

    def begin_message(self, message_key: bytes, offset: int) -> None:
        """The message at source `offset`, keyed `message_key`, is about to go through the steps."""
        self.begin_scoped(message_prefix(message_key), offset)

    def begin_scoped(self, prefix: bytes, offset: int) -> None:
        """`begin_message` with the message key's `keys.message_prefix` already made."""
        for state in self._state_list:
            state._bind(prefix, offset)

    def accept_message(self, offset: int) -> None:
        """The message at `offset` succeeded: its writes stay in the cache, tagged with its offset."""
        for journal in self.journals:
            if journal:
                journal.clear()
        self.next_offset = offset + 1

    def discard_message(self) -> None:
        """Undo the current message's writes (and forget what windows they opened, closed or expired)."""
        for window in self.window_list:
            if window.writing:
                window.forget()
        for cache in self._cache_list:
            if cache.journal:
                cache.undo()

    def pass_message(self, offset: int) -> None:
        """A message that was skipped or dead-lettered: it moves the offset but changes no state."""
        self.discard_message()
        self.next_offset = offset + 1

    def changes(self, store: str) -> list[Change]:
        """(key, serialized value or None for a delete, source offset), each changed key once."""
        return self.caches[store].changes()

    def roll_back(self) -> None:
        """Drop every uncommitted change: the partition is processed again from `committed_offset`."""
        for cache in self.caches.values():
            cache.drop_dirty()
        self.discard_message()
        for window in self.window_list:
            window.forget()
        self.next_offset = self.committed_offset

    def committed(self) -> None:
        """Everything up to `next_offset` is durable: start a new transaction (the cache stays, clean)."""
        for cache in self.caches.values():
            cache.mark_clean()
        self.committed_offset = self.next_offset
