"""Key-value state that expires: the entries of a store with a time-to-live.

Owns `TtlState` (the `State` a step gets from a store declared `Store(name, ttl=...)`) and how such
a store keeps expiries. Time is stream time, as for windows: the largest message timestamp the
partition has seen, kept under `keys.STREAM_TIME_KEY` (8 bytes) and restored with the store, so
that a restore or a reprocessing expires exactly the entries the first run did.

Each value is stored behind a 12-byte header, `EXPIRY_MAGIC` and its expiry (stream time of its
last `set` plus the TTL, 8 bytes big-endian), so the changelog and every restore carry expiries
with the values. An entry whose expiry stream time has reached reads as missing at once; it is
deleted from RocksDB, and tombstoned in the changelog, by the next commit once a commit's stream
time has reached its expiry (`expire`; a deletion decided by the stream time of messages a crash
might leave uncommitted could remove the entry's committed value from the compacted changelog),
popping due entries from an in-memory heap of (expiry, key), one per live key. The stream time of
the last commit comes from the commit itself and wins over the store's
(`stream_time.CommittedStreamTime`). The heap is built at the first commit of the partition from
RocksDB and the record cache; values stored before the store had a TTL (no header) get one then
(expiring a TTL after that stream time), so switching a TTL on for an existing store needs
nothing else.
"""

from __future__ import annotations

import heapq
import logging
from typing import Any

from dagster_stateful.core.state.cache import StoreCache
from dagster_stateful.core.state.keys import STREAM_TIME_KEY, encode_state_key
from dagster_stateful.core.state.kv import State
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.serialization import Serde
from dagster_stateful.core.state.stream_time import CommittedStreamTime, decode_stream_time, encode_stream_time

__all__ = ["EXPIRY_MAGIC", "TtlState", "split_expiry", "with_expiry"]

log = logging.getLogger(__name__)

EXPIRY_MAGIC = b"\xffTTL"
"""How an expiring value starts: no JSON value does, so values stored before the TTL are told apart."""
_HEADER_BYTES = len(EXPIRY_MAGIC) + 8
_MISSING: Any = object()


def with_expiry(expiry: int, data: bytes) -> bytes:
    """`data` (a serialized value) behind its expiry header."""
    return EXPIRY_MAGIC + expiry.to_bytes(8, "big", signed=True) + data


def split_expiry(data: bytes) -> tuple[int | None, bytes]:
    """(expiry in ms of stream time, serialized value) of a stored value; no expiry for a value
    stored before the store had a TTL."""
    if data[:4] == EXPIRY_MAGIC and len(data) >= _HEADER_BYTES:
        return int.from_bytes(data[4:_HEADER_BYTES], "big", signed=True), data[_HEADER_BYTES:]
    return None, data


class TtlState(State, CommittedStreamTime):
    """Key-value state of one expiring store for the current message key; the partition transaction
    reports each message's timestamp to it (`observe`) before the steps run."""

    __slots__ = ("_committed_stream_time", "_expiring", "_stored_stream_time", "_stream_time", "_tracked", "ttl")

    def __init__(self, partition: StorePartition, cache: StoreCache, serde: Serde, ttl: int) -> None:
        super().__init__(partition, cache, serde)
        self.ttl = ttl
        self._committed_stream_time: int | None = None
        self.forget()

    def forget(self) -> None:
        """Drop what is known in memory (after a roll-back): stream time and the expiry heap are read
        again, from RocksDB and the record cache, when next needed."""
        self._stream_time: int | None = None
        self._stored_stream_time = -1
        self._expiring: list[tuple[int, bytes]] | None = None
        self._tracked: dict[bytes, int] = {}
        """Keys in the heap, with the expiry they are in it under (their value's may be later)."""

    @property
    def stream_time_to_commit(self) -> int:
        """The stream time a commit now records (-1: none yet)."""
        return self.stream_time

    @property
    def expiries_due(self) -> bool:
        """Whether entries wait for the next commit to delete them (the last commit's stream time
        reached their expiry)."""
        committed, heap = self._committed_stream_time, self._expiring
        return committed is not None and bool(heap) and heap is not None and heap[0][0] <= committed

    @property
    def stream_time(self) -> int:
        """The largest message timestamp this partition has seen (-1: none yet)."""
        if self._stream_time is None:
            data = self._values.get(STREAM_TIME_KEY, _MISSING)
            if data is _MISSING:
                data = self._partition.get(STREAM_TIME_KEY)
            found = decode_stream_time(data)
            self._stored_stream_time = found
            self._stream_time = self._settle_stream_time(found, STREAM_TIME_KEY in self._cache.dirty)
        return self._stream_time

    def observe(self, timestamp: int) -> None:
        """The current message's timestamp (ms): stream time moves up to it."""
        if timestamp > self.stream_time:
            self._stream_time = timestamp

    def get(self, key: str | bytes, default: Any = None) -> Any:
        self._metrics.gets += 1
        store_key = self._prefix + encode_state_key(key)
        data = self._values.get(store_key, _MISSING)
        if data is _MISSING:
            self._metrics.misses += 1
            data = self._read(store_key)
        if data is None:
            return default
        if data[:4] == EXPIRY_MAGIC:
            if int.from_bytes(data[4:_HEADER_BYTES], "big", signed=True) <= self.stream_time:
                return default
            data = data[_HEADER_BYTES:]
        return self._decode(data)

    def set(self, key: str | bytes, value: Any) -> None:
        """Store `value` until stream time passes the current one by the TTL (a later set extends it).
        Raises `StateSerializationError` (a failure of the step) when the serializer refuses `value`."""
        if value is None:
            raise ValueError("state values cannot be None; use state.delete(key)")
        self._metrics.puts += 1
        store_key = self._prefix + encode_state_key(key)
        expiry = self.stream_time + self.ttl
        self._cache.put(store_key, with_expiry(expiry, self._encode(key, value)), self._offset)
        if self._expiring is not None and store_key not in self._tracked:
            self._track(store_key, expiry)

    def _stored(self, store_key: bytes) -> bytes | None:
        data = self._values.get(store_key, _MISSING)
        return self._read(store_key) if data is _MISSING else data

    def _read(self, store_key: bytes) -> bytes | None:
        """RocksDB's value of `store_key`, remembered by the record cache."""
        data = self._partition.get(store_key)
        self._cache.remember(store_key, data)
        return data

    def _track(self, store_key: bytes, expiry: int) -> None:
        assert self._expiring is not None
        heapq.heappush(self._expiring, (expiry, store_key))
        self._tracked[store_key] = expiry

    def expire(self, offset: int) -> int:
        """Before a commit: delete every entry the last commit's stream time has reached (a tombstone
        each, in the commit), and keep stream time, both as changes of the message at source
        `offset`. Returns how many entries expired."""
        stream_time = self.stream_time
        committed = self._committed_stream_time if self._committed_stream_time is not None else -1
        heap = self._ensure_heap(offset)
        expired = 0
        while heap and heap[0][0] <= committed:
            _, store_key = heapq.heappop(heap)
            del self._tracked[store_key]
            data = self._stored(store_key)
            if data is None:
                continue  # deleted, or its set was undone
            expiry, _ = split_expiry(data)
            if expiry is not None and expiry > committed:
                self._track(store_key, expiry)  # set again since it entered the heap
                continue
            self._cache.put(store_key, None, offset)
            expired += 1
        if stream_time != self._stored_stream_time:
            self._cache.put(STREAM_TIME_KEY, encode_stream_time(stream_time), offset)
            self._stored_stream_time = stream_time
        self._cache.accept()
        return expired

    def _ensure_heap(self, offset: int) -> list[tuple[int, bytes]]:
        """The heap of live keys by expiry, when not known: RocksDB's, as the record cache changed
        them; values without an expiry (stored before the TTL) get one now, as changes of `offset`."""
        if self._expiring is not None:
            return self._expiring
        values = self._values
        found: dict[bytes, bytes | None] = {}
        for store_key, data in self._partition.items():
            if store_key != STREAM_TIME_KEY:
                found[store_key] = values.get(store_key, data)
        for store_key in self._cache.dirty:
            if store_key != STREAM_TIME_KEY:
                found[store_key] = values[store_key]
        self._expiring, self._tracked = [], {}
        stamped = 0
        for store_key, stored in found.items():
            if stored is None:
                continue
            expiry, payload = split_expiry(stored)
            if expiry is None:
                expiry = self.stream_time + self.ttl
                self._cache.put(store_key, with_expiry(expiry, payload), offset)
                stamped += 1
            self._expiring.append((expiry, store_key))
            self._tracked[store_key] = expiry
        heapq.heapify(self._expiring)
        if stamped:
            log.info(
                "Store %r partition %d: %d entries stored before the store had a TTL now expire %d ms of stream time "
                "from now",
                self._partition.store,
                self._partition.partition,
                stamped,
                self.ttl,
            )
        return self._expiring
