"""A versioned table's values: every version of a key, each valid from its timestamp to the next one's.

Owns the encoding of one key's versions (Kafka Streams' versioned key-value stores, KIP-889) as
one RocksDB value, and the two things done with them: `put` a version (a tombstone is a version
too: the key holds nothing from its timestamp on) and read the value `as_of` a timestamp. A
version with the timestamp of one already held replaces it, so applying the same records twice
gives the same versions. Versions older than the history kept (`history_ms` before the newest
timestamp the table has seen) are dropped, except the newest of them, which is still the value at
the start of the history; a lookup older than the history finds nothing, as Kafka Streams'.

Encoding: a sequence of versions in timestamp order, each `timestamp (8 bytes, signed big-endian)`,
`length (4 bytes; 0xFFFFFFFF for a tombstone)`, then the value's bytes.
"""

from __future__ import annotations

import struct
from bisect import bisect_right

Version = tuple[int, bytes | None]
"""(timestamp in ms, value or None for a tombstone)."""

_HEADER = struct.Struct(">qI")
_TOMBSTONE = 0xFFFFFFFF


def decode_versions(data: bytes | None) -> list[Version]:
    """The versions `data` encodes, oldest first (none for None)."""
    versions: list[Version] = []
    if not data:
        return versions
    at, end = 0, len(data)
    while at < end:
        timestamp, length = _HEADER.unpack_from(data, at)
        at += _HEADER.size
        if length == _TOMBSTONE:
            versions.append((timestamp, None))
            continue
        versions.append((timestamp, data[at : at + length]))
        at += length
    return versions


def encode_versions(versions: list[Version]) -> bytes:
    parts = []
    for timestamp, value in versions:
        parts.append(_HEADER.pack(timestamp, _TOMBSTONE if value is None else len(value)))
        if value is not None:
            parts.append(value)
    return b"".join(parts)


def put(data: bytes | None, timestamp: int, value: bytes | None, history_ms: int, newest_seen: int) -> bytes | None:
    """The key's versions once the version (`timestamp`, `value`) is added, and those older than the
    history (before `newest_seen - history_ms`) dropped but the newest of them; None when nothing
    but a tombstone would be left (the key holds nothing at any time kept)."""
    versions = decode_versions(data)
    timestamps = [version[0] for version in versions]
    at = bisect_right(timestamps, timestamp)
    if at and timestamps[at - 1] == timestamp:
        versions[at - 1] = (timestamp, value)
    else:
        versions.insert(at, (timestamp, value))
    cutoff = newest_seen - history_ms
    first_kept = 0
    while first_kept + 1 < len(versions) and versions[first_kept + 1][0] <= cutoff:
        first_kept += 1
    versions = versions[first_kept:]
    if all(version[1] is None for version in versions):
        return None
    return encode_versions(versions)


def as_of(data: bytes | None, timestamp: int, history_ms: int, newest_seen: int) -> bytes | None:
    """The value valid at `timestamp`: the newest version at or before it (None when that is a
    tombstone, when there is none, or when `timestamp` is older than the history kept)."""
    if data is None or timestamp < newest_seen - history_ms:
        return None
    value = None
    for version_time, version_value in decode_versions(data):
        if version_time > timestamp:
            break
        value = version_value
    return value
