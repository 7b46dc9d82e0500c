"""How state keys are scoped to message keys inside a store.

Owns the stored key format: a 4-byte big-endian length of the message key, the message key,
then the state key's bytes. The length prefix makes the scope unambiguous (no separator can
collide with key bytes), so one message key can never read or write another's state, and all
state of one message key is contiguous in RocksDB's byte order.
"""

from __future__ import annotations

import struct

_LENGTH_BYTES = 4
_LENGTH = struct.Struct(">I")

RESERVED_PREFIX = b"\xff" * 4
"""Where a store's records outside every message key's scope begin (its stream time, its timers): no
scoped key does, since no message key is 4 GiB long."""

STREAM_TIME_KEY = b"\xff" * 8 + b"stream-time"
"""Where a store that keeps time (a window or TTL store) keeps its partition's stream time: it sorts
after every window key and cannot be a scoped key (no message key is 4 GiB long)."""


def is_reserved(store_key: bytes) -> bool:
    """Whether a stored key is one of the store's own records (`RESERVED_PREFIX`), not a message key's state."""
    return store_key[:4] == RESERVED_PREFIX


def message_prefix(message_key: bytes) -> bytes:
    return len(message_key).to_bytes(_LENGTH_BYTES, "big") + message_key


def scoped_keys(message_keys: list[bytes], state_key: bytes) -> list[bytes]:
    """The store key of `state_key` under each message key (`message_prefix` + state key), for a batch."""
    pack = _LENGTH.pack
    return [pack(len(key)) + key + state_key for key in message_keys]


def encode_state_key(state_key: str | bytes) -> bytes:
    if isinstance(state_key, str):
        return state_key.encode()
    if isinstance(state_key, bytes):
        return state_key
    raise TypeError(f"state keys are str or bytes, got {type(state_key).__name__}")


def split_store_key(store_key: bytes) -> tuple[bytes, bytes]:
    """(message key, state key bytes) of a stored key."""
    length = int.from_bytes(store_key[:_LENGTH_BYTES], "big")
    end = _LENGTH_BYTES + length
    if end > len(store_key):
        raise ValueError(f"not a scoped state key: {store_key[:40]!r}")
    return store_key[_LENGTH_BYTES:end], store_key[end:]
