"""Serializers for message keys and values and for state values.

Owns the `Serde` protocol and the built-in codecs: bytes, str (UTF-8), int (8-byte signed
big-endian, or decimal text on input) and JSON (orjson, the default for values). `resolve_serde`
accepts a codec or one of the names "bytes", "str", "int", "json"; `fast_loads` and `fast_dumps`
give the hot path the C function a built-in codec wraps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import orjson

from dagster_stateful.errors import ConfigurationError, StateSerializationError


class Serde(Protocol):
    """Turns Python values into bytes and back. `loads` raises ValueError on malformed input."""

    name: str

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class BytesSerde:
    name = "bytes"

    def dumps(self, value: Any) -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"the bytes serializer needs bytes, got {type(value).__name__}")
        return bytes(value)

    def loads(self, data: bytes) -> Any:
        return data


class StrSerde:
    name = "str"

    def dumps(self, value: Any) -> bytes:
        if not isinstance(value, str):
            raise TypeError(f"the str serializer needs str, got {type(value).__name__}")
        return value.encode()

    def loads(self, data: bytes) -> Any:
        return data.decode()


class IntSerde:
    """8-byte signed big-endian integers; decimal text (as console producers write) is read too."""

    name = "int"

    def dumps(self, value: Any) -> bytes:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"the int serializer needs int, got {type(value).__name__}")
        return value.to_bytes(8, "big", signed=True)

    def loads(self, data: bytes) -> Any:
        if len(data) == 8:
            return int.from_bytes(data, "big", signed=True)
        try:
            return int(data.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            raise ValueError(f"not an 8-byte integer nor decimal text: {data[:32]!r}") from None


class JsonSerde:
    name = "json"

    def dumps(self, value: Any) -> bytes:
        return orjson.dumps(value)

    def loads(self, data: bytes) -> Any:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as error:
            raise ValueError(f"invalid JSON: {error}") from None


_BY_NAME: dict[str, Serde] = {serde.name: serde for serde in (BytesSerde(), StrSerde(), IntSerde(), JsonSerde())}


def fast_loads(serde: Serde) -> Callable[[bytes], Any]:
    """What decodes like `serde.loads` on good input, at least as fast. For JSON it is orjson itself:
    on malformed input it raises a terser ValueError, so callers that report one call `serde.loads`
    again for the message it gives."""
    if type(serde) is JsonSerde:
        return orjson.loads
    if type(serde) is StrSerde:
        return bytes.decode
    return serde.loads


def fast_dumps(serde: Serde) -> Callable[[Any], bytes]:
    """What encodes like `serde.dumps`, into bytes no larger than their content, for values that a
    cache keeps: orjson's own keep the 4 KiB buffer they were written in (1M cached values would
    hold 4 GiB), so for JSON they are copied."""
    return _compact_json if type(serde) is JsonSerde else serde.dumps


def _compact_json(value: Any) -> bytes:
    return b"%b" % orjson.dumps(value)


def _json_of_each(values: list[Any]) -> list[bytes] | None:
    """Each value's JSON, as `_compact_json` gives it, from one encoding of them all as an array, split
    at its commas: exact when the split finds one part per value, which holds when no value's JSON
    holds a comma (numbers, the aggregates of a columnar worker). None when it does not hold, or when
    orjson refuses a value. About a quarter of the time of one call per value."""
    try:
        array = orjson.dumps(values)
    except orjson.JSONEncodeError:
        return None
    parts = array[1:-1].split(b",")
    return parts if values and len(parts) == len(values) else None


class LiveSerializer:
    """Encodes the aggregates a live record cache holds for store `store`: one (`__call__`), or a
    commit's worth at once (`many`, with no Python step per value when the serde takes them all).
    A value the serde refuses raises a `StateSerializationError` naming the store and its key."""

    __slots__ = ("_dumps", "_exact", "_serde", "_store")

    def __init__(self, store: str, serde: Serde) -> None:
        self._store = store
        self._serde = serde
        self._dumps = fast_dumps(serde)
        self._exact = type(serde) is JsonSerde
        """Whether `_dumps` always returns bytes."""

    def __call__(self, key: bytes, value: Any) -> bytes:
        try:
            data = self._dumps(value)
        except Exception as error:
            raise self._refused(key, value, error) from error
        return data if data.__class__ is bytes else bytes(data)

    def many(self, keys: list[bytes], values: list[Any]) -> list[bytes]:
        """The encodings of `values` (none of them None), whose store keys are `keys`."""
        if self._exact:
            each = _json_of_each(values)
            if each is not None:
                return each
        try:
            encoded = list(map(self._dumps, values))
        except Exception as error:
            raise self._first_refused(keys, values, error) from error
        if self._exact:
            return encoded
        return [data if data.__class__ is bytes else bytes(data) for data in encoded]

    def _first_refused(self, keys: list[bytes], values: list[Any], error: Exception) -> StateSerializationError:
        """The error naming the first of `values` the serde refuses (`error`, if it takes each alone)."""
        for key, value in zip(keys, values, strict=True):
            try:
                self._dumps(value)
            except Exception as refusal:  # noqa: BLE001 - the refusal becomes the error returned
                return self._refused(key, value, refusal)
        return self._refused(keys[0], values[0], error)

    def _refused(self, key: bytes, value: Any, error: Exception) -> StateSerializationError:
        serde = getattr(self._serde, "name", type(self._serde).__name__)
        return StateSerializationError(
            f"cannot store the {type(value).__name__} aggregate under store key {key!r} of store {self._store!r}: the "
            f"{serde!r} state serializer refused it ({type(error).__name__}: {error}). Make the aggregator return "
            "values it can encode (for JSON: numbers, strings, lists, dicts), or give the app a state_serde that can."
        )


def resolve_serde(serde: Serde | str) -> Serde:
    if isinstance(serde, str):
        try:
            return _BY_NAME[serde]
        except KeyError:
            raise ConfigurationError(
                f"unknown serializer {serde!r}; use one of {sorted(_BY_NAME)} or a Serde"
            ) from None
    return serde
