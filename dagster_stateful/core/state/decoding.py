"""How a store's stored rows read as state: message keys, state keys, windows, expiries and values.

Owns `StoreShape` (what must be known of a store to decode it), the decoded rows (`StateEntry`,
`WindowEntry`) and `RowDecoder`, which turns a stored (key, value) pair into one of them with the
app's key and state serializers (a partitioned table's: with the table's). A RocksDB partition
read in place (`query.StoreReader`) and a snapshot read as a table (`recovery.state_table`) decode
through it, so both read alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dagster_stateful.core.state.keys import split_store_key
from dagster_stateful.core.state.serialization import Serde
from dagster_stateful.core.state.stream_time import decode_stream_time
from dagster_stateful.core.state.ttl import split_expiry
from dagster_stateful.core.state.window_state import split_window_key

__all__ = ["RowDecoder", "StateEntry", "StoreShape", "WindowEntry"]


@dataclass(frozen=True)
class StateEntry:
    """One state value of a key-value (or aggregation) store."""

    partition: int
    message_key: Any
    """The message key, decoded with the app's key serializer."""
    state_key: str
    """The state key (`state.set(state_key, ...)`; an aggregation's name), as text (bytes keys as their repr)."""
    value: Any
    expires_at: int | None = None
    """An expiring store's: the stream time (ms) at which the entry expires."""


@dataclass(frozen=True)
class WindowEntry:
    """One window of a window store."""

    partition: int
    message_key: Any
    start: int
    end: int
    value: Any


@dataclass(frozen=True)
class StoreShape:
    """What a reader must know of a store to decode it."""

    name: str
    ttl: int | None = None
    window_size: int | None = None
    """A window store's window size (ms); None for a key-value or aggregation store."""
    window_retention: int | None = None
    """How long (ms of stream time) a window store keeps a window after its start (a session store:
    a session after its end)."""
    table: bool = False
    """A partitioned table's store (`App.table`): each stored key is the message key itself, with no
    state key, and each value the table's value (decoded with the table's serializers)."""
    sessions: bool = False
    """A session store's: each value is [end, aggregate]."""

    @property
    def is_window_store(self) -> bool:
        """Whether the store holds windows (or sessions), keyed by start and message key."""
        return self.window_size is not None or self.sessions


class RowDecoder:
    """Decodes one store's stored rows with the app's serializers."""

    def __init__(self, shape: StoreShape, key_serde: Serde, state_serde: Serde) -> None:
        self.shape = shape
        self.key_serde = key_serde
        self.state_serde = state_serde

    def stream_time(self, data: bytes | None) -> int:
        """The partition's stream time from its stored record (`keys.STREAM_TIME_KEY`'s value; -1: none)."""
        if data is None:
            return -1
        return self.value(data) if self.shape.is_window_store else decode_stream_time(data)

    def live_window(self, partition: int, store_key: bytes, data: bytes, stream_time: int) -> WindowEntry | None:
        """A window (or session) store's row; None when it is past its retention at `stream_time`
        (the next commit deletes it)."""
        retention = self.shape.window_retention
        if self.shape.sessions:
            entry = self.window(partition, store_key, data)
            return None if retention is not None and entry.end + retention < stream_time else entry
        if retention is not None and split_window_key(store_key)[0] <= stream_time - retention:
            return None
        return self.window(partition, store_key, data)

    def entry(self, partition: int, store_key: bytes, data: bytes, stream_time: int) -> StateEntry | None:
        """A key-value store's row (a table's: with an empty state key); None when it has expired by `stream_time`."""
        if self.shape.table:
            return StateEntry(partition, self.message_key(store_key), "", self.value(data))
        expiry, payload = split_expiry(data) if self.shape.ttl is not None else (None, data)
        if expiry is not None and expiry <= stream_time:
            return None
        key, state_key = split_store_key(store_key)
        return StateEntry(partition, self.message_key(key), _text(state_key), self.value(payload), expiry)

    def window(self, partition: int, store_key: bytes, data: bytes) -> WindowEntry:
        """A window (or session) store's row."""
        start, key = split_window_key(store_key)
        if self.shape.sessions:
            end, value = self.value(data)
            return WindowEntry(partition, self.message_key(key), start, end, value)
        size = self.shape.window_size
        assert size is not None, "only a window store has windows"
        return WindowEntry(partition, self.message_key(key), start, start + size, self.value(data))

    def value(self, data: bytes) -> Any:
        return self.state_serde.loads(data)

    def message_key(self, key: bytes) -> Any:
        try:
            return self.key_serde.loads(key)
        except Exception:  # noqa: BLE001 - a key the serializer cannot read is shown as its bytes
            return key

    def key_bytes(self, message_key: Any) -> bytes:
        """A message key as stored: bytes as they are, else the key serializer's bytes (text it cannot
        take as it is, such as "42" for the int serializer, is read the way the serializer reads text)."""
        if isinstance(message_key, bytes):
            return message_key
        try:
            return self.key_serde.dumps(message_key)
        except (TypeError, ValueError):
            if not isinstance(message_key, str):
                raise
            return self.key_serde.dumps(self.key_serde.loads(message_key.encode()))


def _text(state_key: bytes) -> str:
    try:
        return state_key.decode()
    except UnicodeDecodeError:
        return repr(state_key)
