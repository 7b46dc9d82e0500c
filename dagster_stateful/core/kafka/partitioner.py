"""Which partition a keyed record goes to under the producers' partitioner.

Owns `partition_of`: Kafka's default partitioner (the Java client's, and librdkafka's
`murmur2_random`: murmur2 of the key bytes, made positive, modulo the partition count) and
librdkafka's own default (`consistent_random`: CRC-32 of the key bytes; an empty key goes to a
random partition, so it has none). State placed on a
partition must be where the key's messages arrive, so a bootstrap asks which one its producers use.
"""

from __future__ import annotations

import zlib
from typing import Literal

__all__ = ["PARTITIONERS", "Partitioner", "murmur2", "partition_of"]

Partitioner = Literal["murmur2", "consistent"]
PARTITIONERS: tuple[Partitioner, ...] = ("murmur2", "consistent")

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """The 32-bit murmur2 hash of `data` as Kafka's `Utils.murmur2` computes it (unsigned here)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length % 4
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    return h ^ (h >> 15)


def partition_of(key: bytes, partitions: int, partitioner: Partitioner = "murmur2") -> int:
    """The partition of a record keyed `key` on a topic of `partitions` partitions."""
    if partitioner == "murmur2":
        return (murmur2(key) & 0x7FFFFFFF) % partitions
    if partitioner == "consistent":
        if not key:
            raise ValueError(
                "librdkafka's consistent partitioner sends messages with an empty key to random partitions"
            )
        return zlib.crc32(key) % partitions
    raise ValueError(f"unknown partitioner {partitioner!r}; use one of {list(PARTITIONERS)}")
