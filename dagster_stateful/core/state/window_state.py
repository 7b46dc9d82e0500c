"""The state of a windowed aggregation: per message key and time window, one aggregate.

Owns `WindowState` and the window store's key layout. A window store holds the windows of one
windowed aggregation: each window's aggregate under `window_key(start, message prefix)`, the
window's start first (8 bytes, big-endian), so that RocksDB keeps windows in time order and the
windows of a time range are contiguous; and the partition's stream time (the largest event time
seen, as in Kafka Streams) under `STREAM_TIME_KEY`, which sorts after every window. Both go
through the live record cache (aggregates as objects, serialized once per commit) and so to the
changelog, and both are restored from it.

Stream time decides everything else: a window closes once stream time reaches its end plus the
grace period (a message only for closed windows is late), and expires once stream time reaches
its start plus the retention period. An expired window is gone for readers at once; it is
deleted, locally and with a tombstone in the changelog, by the next commit once a commit's
stream time (`committed_stream_time`) has reached its retention: a deletion decided by the stream
time of messages a crash might leave uncommitted could remove the window's committed tally from
the compacted changelog, and the messages processed again would then find it empty. The stream
time of the last commit comes from the commit itself and wins over the store's
(`stream_time.CommittedStreamTime`). Which windows are live is indexed in memory (start ->
message prefixes; read from RocksDB and the record cache at the partition's first message, and
again after a message or a commit was undone) so that closing and expiring cost nothing while no
window is due.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dagster_stateful.core.state.cache import StoreCache
from dagster_stateful.core.state.keys import STREAM_TIME_KEY
from dagster_stateful.core.state.live import LiveState
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.serialization import Serde
from dagster_stateful.core.state.stream_time import CommittedStreamTime

__all__ = ["STREAM_TIME_KEY", "Window", "WindowBounds", "WindowState", "split_window_key", "window_key"]

_START_BYTES = 8

_MISSING: Any = object()

Window = tuple[bytes, int, Any]
"""A window of one message key: (message key, start in ms, aggregate)."""


def window_key(start: int, prefix: bytes) -> bytes:
    """The store key of the window starting at `start` (ms) for the message key of `prefix`."""
    return start.to_bytes(_START_BYTES, "big") + prefix


def split_window_key(key: bytes) -> tuple[int, bytes]:
    """(start in ms, message key) of a window store key."""
    return int.from_bytes(key[:_START_BYTES], "big"), key[_START_BYTES + 4 :]


@dataclass(frozen=True)
class WindowBounds:
    """How long a window store's windows live, in ms of event time."""

    size: int
    grace: int
    retention: int

    def closes_at(self, start: int) -> int:
        """Stream time at which the window starting at `start` closes."""
        return start + self.size + self.grace


class WindowState(LiveState, CommittedStreamTime):
    """The windows of one window store partition, for the current message key and event time (bound
    by the partition transaction)."""

    __slots__ = (
        "_bounds",
        "_closing",
        "_committed_stream_time",
        "_expiring",
        "_idle_advanced",
        "_index",
        "_stream_time",
        "timestamp",
    )

    def __init__(self, partition: StorePartition, cache: StoreCache, serde: Serde, bounds: WindowBounds) -> None:
        """`cache` must be live (made with a `serialization.LiveSerializer`)."""
        super().__init__(partition, cache, serde)
        self._bounds = bounds
        self.timestamp = 0
        """The current message's event time in ms (set before each message)."""
        self._committed_stream_time: int | None = None
        self._idle_advanced = False
        """Stream time was moved by an idle advance since the last commit (which must then record it)."""
        self.forget()

    def forget(self) -> None:
        """Drop the in-memory index of live windows (after a roll-back): it is read again when next needed."""
        self._index: dict[int, set[bytes]] | None = None
        self._closing: list[int] = []
        """Starts of windows not yet closed (a heap)."""
        self._expiring: list[int] = []
        """Starts of every live window (a heap)."""
        self._stream_time: int | None = None

    @property
    def stream_time_to_commit(self) -> int | None:
        """The stream time a commit now records (None: the partition has none yet)."""
        if self._stream_time is not None:
            return self._stream_time
        if STREAM_TIME_KEY in self._cache.dirty:  # moved since the last commit, then forgotten (`forget`)
            return int(self._values[STREAM_TIME_KEY])
        if self._committed_stream_time is not None:
            return self._committed_stream_time
        data = self._partition.get(STREAM_TIME_KEY)
        return None if data is None else self._decode(data)

    def mark_committed(self) -> None:
        """The commit succeeded: the stream time it recorded is the committed one (also when the
        index was forgotten after a failed message, with stream time moved by those before it)."""
        recorded = self.stream_time_to_commit
        if recorded is not None:
            self._committed_stream_time = recorded
        self._idle_advanced = False

    @property
    def expiries_due(self) -> bool:
        """Whether the next commit has work even without new messages: windows whose retention the
        last commit's stream time reached, to delete, or an idle advance's stream time to record."""
        committed, expiring = self._committed_stream_time, self._expiring
        return self._idle_advanced or (
            self._index is not None
            and committed is not None
            and bool(expiring)
            and expiring[0] + self._bounds.retention <= committed
        )

    def expire_committed(self, offset: int) -> None:
        """Before a commit: delete the windows whose retention the last commit's stream time reached,
        as changes of the message at source `offset`."""
        committed = self._committed_stream_time
        if self._index is None or committed is None:
            return
        expiring, index, retention = self._expiring, self._index, self._bounds.retention
        while expiring and expiring[0] + retention <= committed:
            start = heapq.heappop(expiring)
            for prefix in index.pop(start, ()):
                self._cache.delete_live(window_key(start, prefix), offset)
        self._cache.accept()

    @property
    def message_key(self) -> bytes:
        """The current message's key."""
        return self._prefix[4:]

    @property
    def writing(self) -> bool:
        """Whether the current message has changed this store (so far)."""
        return bool(self._cache.journal)

    @property
    def stream_time(self) -> int:
        """The largest event time this partition has seen (-1: none yet)."""
        self._ensure_index()
        assert self._stream_time is not None
        return self._stream_time

    def update(
        self, starts: list[int], value: Any, first: Callable[[Any], Any], add: Callable[[Any, Any], Any]
    ) -> tuple[list[tuple[int, Any]], list[Window]]:
        """Fold `value` into the current key's windows starting at `starts` (those not closed yet)
        and advance stream time to the message's. Returns (start, aggregate) of each window updated
        (none: the message is late) and the windows that closed, oldest first."""
        index = self._ensure_index()
        stream_time = self._stream_time
        assert stream_time is not None
        timestamp, bounds, prefix = self.timestamp, self._bounds, self._prefix
        updated: list[tuple[int, Any]] = []
        horizon = max(stream_time, timestamp)
        for start in starts:
            if bounds.closes_at(start) <= horizon:
                continue
            updated.append((start, self._fold_key(window_key(start, prefix), value, first, add)))
            keys = index.get(start)
            if keys is None:
                keys = index[start] = set()
                heapq.heappush(self._closing, start)
                heapq.heappush(self._expiring, start)
            keys.add(prefix)
        if timestamp <= stream_time:
            return updated, []
        self._stream_time = timestamp
        self._cache.put_live(STREAM_TIME_KEY, timestamp, self._offset)
        return updated, self._close(timestamp)

    @property
    def next_close(self) -> int | None:
        """The stream time at which the next open window closes (None: none is open)."""
        self._ensure_index()
        return self._bounds.closes_at(self._closing[0]) if self._closing else None

    def advance_idle(self, stream_time: int) -> list[Any]:
        """Move stream time to `stream_time` without a record (the partition is idle: see
        `paths.idle_windows`), as a change of the current message; returns the windows it closed."""
        if stream_time <= self.stream_time:
            return []
        self._stream_time = stream_time
        self._idle_advanced = True
        self._cache.put_live(STREAM_TIME_KEY, stream_time, self._offset)
        return self._closed_by(stream_time)

    def _closed_by(self, stream_time: int) -> list[Any]:
        """The open windows (or sessions) that `stream_time` closes, taken out of the index."""
        return self._close(stream_time)

    def merge_batch(
        self,
        prefixes: list[bytes],
        starts: list[int],
        partials: list[Any],
        offsets: list[int],
        merge: Callable[[Any, Any], Any],
        folded: int,
        stream_time: int,
        advanced_by: int | None,
    ) -> list[Window]:
        """A batch's partials, one per (message key prefix, window start), merged into their windows
        (`merge_partials`; `PartialsRefused` keeps nothing), and stream time moved to the batch's by
        the message at `advanced_by` (None: not moved). The writes stay journaled until the partition
        transaction accepts or discards them, as one message's. Returns the windows that closed,
        oldest first."""
        index = self._ensure_index()
        keys = list(map(window_key, starts, prefixes))
        self.merge_partials(keys, partials, offsets, merge, folded, journaled=True)
        closing, expiring = self._closing, self._expiring
        for start, prefix in zip(starts, prefixes, strict=True):
            members = index.get(start)
            if members is None:
                members = index[start] = set()
                heapq.heappush(closing, start)
                heapq.heappush(expiring, start)
            members.add(prefix)
        if advanced_by is None:
            return []
        self._stream_time = stream_time
        self._cache.put_live(STREAM_TIME_KEY, stream_time, advanced_by)
        return self._close(stream_time)

    def _close(self, stream_time: int) -> list[Window]:
        closing, index, bounds = self._closing, self._index, self._bounds
        assert index is not None
        closed: list[Window] = []
        while closing and bounds.closes_at(closing[0]) <= stream_time:
            start = heapq.heappop(closing)
            for prefix in sorted(index.get(start, ())):
                aggregate = self._read(window_key(start, prefix))
                if aggregate is not None:
                    closed.append((prefix[4:], start, aggregate))
        return closed

    def _read(self, key: bytes) -> Any:
        current = self._values.get(key, _MISSING)
        return self._load(key) if current is _MISSING else current

    def _ensure_index(self) -> dict[int, set[bytes]]:
        """The live windows by start, when not known: those in RocksDB, as the record cache has
        changed them since the last commit."""
        if self._index is not None:
            return self._index
        index: dict[int, set[bytes]] = {}
        stream_time = -1
        for key, data in self._partition.items():
            if key == STREAM_TIME_KEY:
                stream_time = self._decode(data)
            else:
                index.setdefault(int.from_bytes(key[:_START_BYTES], "big"), set()).add(key[_START_BYTES:])
        for key, value in self._values.items():
            if key == STREAM_TIME_KEY:
                stream_time = value
            elif value is None:
                index.get(int.from_bytes(key[:_START_BYTES], "big"), set()).discard(key[_START_BYTES:])
            else:
                index.setdefault(int.from_bytes(key[:_START_BYTES], "big"), set()).add(key[_START_BYTES:])
        index = {start: prefixes for start, prefixes in index.items() if prefixes}
        self._index = index
        self._stream_time = self._reconcile_stream_time(stream_time)
        stream_time = self._stream_time
        self._expiring = sorted(index)
        self._closing = [start for start in self._expiring if self._bounds.closes_at(start) > stream_time]
        return index

    def _reconcile_stream_time(self, found: int) -> int:
        """The stream time to go on from, given the one the store and the record cache hold: the last
        commit's when it is known and this transaction has not moved it (it is then written back, so
        the next commit records it), else the one found."""
        stream_time = self._settle_stream_time(found, STREAM_TIME_KEY in self._cache.dirty)
        if stream_time != found:
            self._cache.put_live(STREAM_TIME_KEY, stream_time, self._offset)
        return stream_time
