"""Key-value state as a stateful step sees it: get / set / delete / exists for the current message key.

Owns `State`. Values are serialized by `State.set`, inside the step, so a value the serializer
refuses fails that message under the app's error policy instead of every commit; the record cache
keeps bytes, and `State.get` returns a freshly deserialized object, so mutating it in place changes
nothing until it is `set`. Writes go to the record cache (`cache.StoreCache`), journaled, so the
partition transaction can undo the writes of a message that fails. Each call is counted in the
partition's metrics; `TIMED_OPERATIONS` says which are timed on sampled messages (see `view.timed_variant`).
"""

from __future__ import annotations

from typing import Any

from dagster_stateful.core.state.cache import StoreCache
from dagster_stateful.core.state.keys import encode_state_key
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.serialization import Serde, fast_dumps
from dagster_stateful.core.state.timers import TimerQueue
from dagster_stateful.core.state.view import KeyView
from dagster_stateful.errors import ConfigurationError, StateSerializationError

__all__ = ["TIMED_OPERATIONS", "State"]

_MISSING: Any = object()

TIMED_OPERATIONS = {"get": "get", "set": "put", "delete": "delete"}
"""`State`'s methods timed on sampled messages, with the operation each one is."""


class State(KeyView):
    """Key-value state of one store for the current message key only."""

    __slots__ = ("_dumps", "timers")

    def __init__(self, partition: StorePartition, cache: StoreCache, serde: Serde) -> None:
        super().__init__(partition, cache, serde)
        self._dumps = fast_dumps(serde)
        self.timers: TimerQueue | None = None
        """The partition's timers, when the app handles them (`StreamingDataFrame.on_timer`) in this store."""

    def schedule(self, name: str, at: int, *, wall_clock: bool = False) -> None:
        """Call the app's `on_timer` function for this message key once the partition's stream time
        (or, with `wall_clock`, the machine's clock) reaches `at` (ms since the epoch). Scheduling
        `name` again moves the timer; the timer is kept in this store, with the key's state."""
        if not isinstance(name, str) or at.__class__ is not int:
            raise TypeError(f"schedule takes a name (str) and a time (int ms), got {name!r} and {at!r}")
        self._queue().schedule(self._prefix, name, at, wall_clock, self._offset)

    def cancel(self, name: str) -> bool:
        """Cancel this message key's timer `name`; whether one was scheduled."""
        return self._queue().cancel(self._prefix, name, self._offset)

    def timer(self, name: str) -> int | None:
        """When this message key's timer `name` is due (ms), or None when none is scheduled."""
        scheduled = self._queue().due_of(self._prefix, name)
        return None if scheduled is None else scheduled[0]

    def _queue(self) -> TimerQueue:
        if self.timers is None:
            raise ConfigurationError(
                f"store {self._partition.store!r} keeps no timers: declare sdf.on_timer(function, "
                f"store={self._partition.store!r}) to schedule them"
            )
        return self.timers

    def get(self, key: str | bytes, default: Any = None) -> Any:
        """A new object on every call: change it, then `set` it, for the change to count."""
        self._metrics.gets += 1
        store_key = self._prefix + (key.encode() if key.__class__ is str else encode_state_key(key))
        data = self._values.get(store_key, _MISSING)
        if data is _MISSING:
            self._metrics.misses += 1
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
        self._metrics.puts += 1
        store_key = self._prefix + (key.encode() if key.__class__ is str else encode_state_key(key))
        try:
            data = self._dumps(value)
        except Exception as error:
            raise self._refused(key, value, error) from error
        self._cache.put(store_key, data if data.__class__ is bytes else self._as_bytes(key, data), self._offset)

    def delete(self, key: str | bytes) -> None:
        self._metrics.deletes += 1
        self._cache.put(self._prefix + encode_state_key(key), None, self._offset)

    def _encode(self, key: str | bytes, value: Any) -> bytes:
        """`value` serialized (what `set` stores), or the `StateSerializationError` it raises."""
        try:
            data = self._dumps(value)
        except Exception as error:
            raise self._refused(key, value, error) from error
        return data if data.__class__ is bytes else self._as_bytes(key, data)

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
