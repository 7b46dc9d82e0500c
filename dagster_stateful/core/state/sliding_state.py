"""The state of a sliding-window aggregation: per message key, the windows its records define and the records.

Owns `SlidingState`, `SlidingBounds` and the sliding store's layout. Sliding windows are Kafka
Streams' `SlidingWindows`: windows [start, start + d] (ms, both ends inclusive) of a time
difference d, one ending at each record (its left window, [t - d, t], or [0, d] for a record
earlier than d) and one starting just after each record that a later record of its key lies within
d of (its right window, [t + 1, t + 1 + d]); a window aggregates exactly the records in its bounds.
A window closes once stream time passes its end plus the grace (a window of size d + 1 in the
terms of `window_state.WindowBounds`), and a record is late once every window it could fall in has
closed (t + d + grace < stream time). Only open windows are changed or made, so a closed window's
result is final.

The store keeps each window's aggregate under `window_key(start, message prefix)`, as a window
store does (readers see a window store of size d), the partition's stream time under
`STREAM_TIME_KEY`, and every record still needed to make a new window under a reserved key
(`SLIDING_RECORD + message prefix + timestamp + offset`, passed by readers): a window that a record
arriving out of order brings into being is folded from the records in its bounds. An existing
window gets each new record of its bounds added. A record stops being needed once its right window
has closed (t + 1 + d + grace < stream time: no open window holds it then), and a window once
stream time passes its start plus the retention (at least d + grace + 1); both are deleted, with
tombstones in the changelog, by the commit after the one whose stream time expired them (see
`window_state`).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dagster_stateful.core.state.cache import StoreCache
from dagster_stateful.core.state.keys import RESERVED_PREFIX, STREAM_TIME_KEY
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.serialization import Serde
from dagster_stateful.core.state.window_state import Window, WindowBounds, WindowState, window_key

__all__ = ["SLIDING_RECORD", "SlidingBounds", "SlidingState"]

SLIDING_RECORD = RESERVED_PREFIX + b"sliding-record"
_TIME_BYTES = 8
_START_BYTES = 8

_Record = tuple[int, int]
"""A record of one message key: (timestamp, source offset)."""


def _record_key(prefix: bytes, timestamp: int, offset: int) -> bytes:
    return (
        SLIDING_RECORD
        + prefix
        + timestamp.to_bytes(_TIME_BYTES, "big")
        + offset.to_bytes(_TIME_BYTES, "big", signed=True)
    )


def _split_record_key(key: bytes) -> tuple[bytes, int, int]:
    """(message prefix, timestamp, offset) of a record's key."""
    body = key[len(SLIDING_RECORD) :]
    prefix, timestamp, offset = body[: -2 * _TIME_BYTES], body[-2 * _TIME_BYTES : -_TIME_BYTES], body[-_TIME_BYTES:]
    return prefix, int.from_bytes(timestamp, "big"), int.from_bytes(offset, "big", signed=True)


@dataclass(frozen=True)
class SlidingBounds(WindowBounds):
    """A sliding store's windows: `size` is the time difference d (a window is [start, start + d],
    both ends inclusive), so a window closes once stream time passes start + d + grace."""

    def closes_at(self, start: int) -> int:
        return start + self.size + 1 + self.grace

    def is_late(self, timestamp: int, stream_time: int) -> bool:
        """Whether every window a record at `timestamp` could fall in has closed (the latest ends at
        `timestamp + d`): Kafka Streams' test for a sliding window's expired record."""
        return self.closes_at(timestamp) <= stream_time

    def record_unneeded(self, timestamp: int, stream_time: int) -> bool:
        """Whether no window open, or still to be made, at `stream_time` holds a record at `timestamp`
        or is its right window (made once a later record comes within d of it)."""
        return self.closes_at(timestamp + 1) <= stream_time


class SlidingState(WindowState):
    """The sliding windows of one store partition, for the current message key and event time (bound
    by the partition transaction).

    In memory: each message prefix's open windows (starts, sorted) and kept records ((timestamp,
    offset), sorted); a heap of open windows by the stream time that closes them, a heap of every
    window by start (for expiry) and a heap of records by timestamp (for expiry)."""

    __slots__ = (
        "_closing_windows",
        "_difference",
        "_kept",
        "_open_windows",
        "_record_expiry",
        "_sliding",
        "_window_expiry",
    )

    def __init__(self, partition: StorePartition, cache: StoreCache, serde: Serde, bounds: SlidingBounds) -> None:
        self._sliding = bounds
        self._difference = bounds.size
        super().__init__(partition, cache, serde, bounds)

    def forget(self) -> None:
        super().forget()
        self._open_windows: dict[bytes, list[int]] | None = None
        """Each message prefix's open windows, by start."""
        self._closing_windows: list[tuple[int, bytes]] = []
        """Open windows by (start, prefix) (a heap): they close in start order."""
        self._kept: dict[bytes, list[_Record]] = {}
        """Each message prefix's records still needed, by (timestamp, offset)."""
        self._window_expiry: list[tuple[int, bytes]] = []
        """Every window by (start, prefix) (a heap), until a commit expires it."""
        self._record_expiry: list[tuple[int, int, bytes]] = []
        """Every kept record by (timestamp, offset, prefix) (a heap), until a commit expires it."""

    @property
    def stream_time(self) -> int:
        self._ensure_windows()
        assert self._stream_time is not None
        return self._stream_time

    @property
    def expiries_due(self) -> bool:
        committed = self._committed_stream_time
        if self._idle_advanced:
            return True
        if self._open_windows is None or committed is None:
            return False
        windows, records = self._window_expiry, self._record_expiry
        return bool(windows and windows[0][0] + self._bounds.retention <= committed) or bool(
            records and self._sliding.record_unneeded(records[0][0], committed)
        )

    def expire_committed(self, offset: int) -> None:
        committed = self._committed_stream_time
        if self._open_windows is None or committed is None:
            return
        windows, retention = self._window_expiry, self._bounds.retention
        while windows and windows[0][0] + retention <= committed:
            start, prefix = heapq.heappop(windows)
            self._cache.delete_live(window_key(start, prefix), offset)
        records, kept, unneeded = self._record_expiry, self._kept, self._sliding.record_unneeded
        while records and unneeded(records[0][0], committed):
            timestamp, record_offset, prefix = heapq.heappop(records)
            mine = kept.get(prefix)
            if mine is not None:
                at = bisect_left(mine, (timestamp, record_offset))
                if at < len(mine) and mine[at] == (timestamp, record_offset):
                    del mine[at]
                if not mine:
                    del kept[prefix]
            self._cache.delete_live(_record_key(prefix, timestamp, record_offset), offset)
        self._cache.accept()

    @property
    def next_close(self) -> int | None:
        self._ensure_windows()
        return self._sliding.closes_at(self._closing_windows[0][0]) if self._closing_windows else None

    def update(self, starts: list[int], value: Any, first: Callable[[Any], Any], add: Callable[[Any, Any], Any]) -> Any:
        raise TypeError("a sliding store's windows are updated with update_sliding")

    def update_sliding(
        self, value: Any, first: Callable[[Any], Any], add: Callable[[Any, Any], Any]
    ) -> tuple[list[tuple[int, Any]] | None, list[Window]]:
        """Fold `value`, at the current event time, into the current key's open windows that hold it,
        make the windows it brings into being (its left window, its right window when a later
        record is within d, the previous record's right window), and advance stream time. Returns
        (start, aggregate) of each window changed or made, by start (None: the record is late and
        changed nothing), and the windows that closed, by start and key."""
        open_windows = self._ensure_windows()
        stream_time = self._stream_time
        assert stream_time is not None
        timestamp, prefix, difference, bounds = self.timestamp, self._prefix, self._difference, self._sliding
        if bounds.is_late(timestamp, stream_time):
            return None, []
        self._metrics.folds += 1
        horizon = max(stream_time, timestamp)
        records = self._kept.setdefault(prefix, [])
        previous = self._previous(records, timestamp)
        record = (timestamp, self._offset)
        at = bisect_left(records, record)
        if at == len(records) or records[at] != record:  # a message processed again keeps one record
            records.insert(at, record)
            heapq.heappush(self._record_expiry, (timestamp, self._offset, prefix))
        self._cache.put_live(_record_key(prefix, timestamp, self._offset), value, self._offset)
        mine = open_windows.setdefault(prefix, [])
        changed: dict[int, Any] = {}
        for start in mine[bisect_left(mine, timestamp - difference) : bisect_right(mine, timestamp)]:
            changed[start] = self._keep(start, add(self._read(window_key(start, prefix)), value))
        candidates = [max(0, timestamp - difference), timestamp + 1]
        if previous is not None and previous + 1 + difference >= timestamp:
            candidates.append(previous + 1)
        for start in candidates:
            if start in changed or bounds.closes_at(start) <= horizon:
                continue
            at = bisect_left(mine, start)
            if at < len(mine) and mine[at] == start:
                continue
            aggregate = self._fold_records(records, start, first, add)
            if aggregate is not None:
                changed[start] = self._keep(start, aggregate)
                self._open(start, mine)
        updated = sorted(changed.items())
        if timestamp <= stream_time:
            return updated, []
        self._stream_time = timestamp
        self._cache.put_live(STREAM_TIME_KEY, timestamp, self._offset)
        return updated, self._close(timestamp)

    def _previous(self, records: list[_Record], timestamp: int) -> int | None:
        """The timestamp of the current key's latest record before `timestamp` (None: it has none)."""
        current = self._offset
        for at in range(bisect_left(records, (timestamp, -(2**63))) - 1, -1, -1):
            if records[at][1] <= current:
                return records[at][0]
        return None

    def _fold_records(
        self, records: list[_Record], start: int, first: Callable[[Any], Any], add: Callable[[Any, Any], Any]
    ) -> Any:
        """The aggregate of the current key's records in [start, start + d] (None: it has none).

        Records of later messages than the current one are left out: under at-least-once a restore
        may bring back those of messages not committed, which are then processed again; folded in
        now, they would make windows their messages came too late to make, and count them twice."""
        aggregate, prefix, current = None, self._prefix, self._offset
        low, high = bisect_left(records, (start, -(2**63))), bisect_right(records, (start + self._difference, 2**63))
        for timestamp, offset in records[low:high]:
            if offset > current:
                continue
            value = self._read(_record_key(prefix, timestamp, offset))
            aggregate = first(value) if aggregate is None else add(aggregate, value)
        return aggregate

    def _open(self, start: int, mine: list[int]) -> None:
        insort(mine, start)
        heapq.heappush(self._closing_windows, (start, self._prefix))
        heapq.heappush(self._window_expiry, (start, self._prefix))

    def _keep(self, start: int, aggregate: Any) -> Any:
        if aggregate is None:
            raise ValueError("the aggregator returned None; an aggregate must be a value the state serializer encodes")
        key = window_key(start, self._prefix)
        if not self._checked:
            self._serialize(key, aggregate)  # a partition's first window: refused here, not at every commit
            self._checked = True
        self._cache.put_live(key, aggregate, self._offset)
        return aggregate

    def _close(self, stream_time: int) -> list[Window]:
        """The open windows that stream time has closed, by start and key, taken out of the index."""
        closing, open_windows, closes_at = self._closing_windows, self._open_windows, self._sliding.closes_at
        assert open_windows is not None
        closed: list[Window] = []
        while closing and closes_at(closing[0][0]) <= stream_time:
            start, prefix = heapq.heappop(closing)
            mine = open_windows.get(prefix)
            if mine:
                at = bisect_left(mine, start)
                if at < len(mine) and mine[at] == start:
                    del mine[at]
                if not mine:
                    del open_windows[prefix]
            aggregate = self._read(window_key(start, prefix))
            if aggregate is not None:
                closed.append((prefix[4:], start, aggregate))
        return closed

    def _ensure_windows(self) -> dict[bytes, list[int]]:
        """The open windows by message prefix, when not known, and the kept records: those in RocksDB,
        as the record cache has changed them since the last commit."""
        if self._open_windows is not None:
            return self._open_windows
        windows: dict[bytes, bool] = {}
        records: dict[bytes, bool] = {}
        stream_time = -1
        for key, data in self._partition.items():
            if key == STREAM_TIME_KEY:
                stream_time = self._decode(data)
            elif key.startswith(SLIDING_RECORD):
                records[key] = True
            elif not key.startswith(RESERVED_PREFIX):
                windows[key] = True
        for key, value in self._values.items():
            if key == STREAM_TIME_KEY:
                stream_time = value
            elif key.startswith(SLIDING_RECORD):
                records[key] = value is not None
            elif not key.startswith(RESERVED_PREFIX):
                windows[key] = value is not None
        reached = self._stream_time = self._reconcile_stream_time(stream_time)
        open_windows: dict[bytes, list[int]] = {}
        closes_at = self._sliding.closes_at
        for key, present in sorted(windows.items()):
            if present:
                start, prefix = int.from_bytes(key[:_START_BYTES], "big"), key[_START_BYTES:]
                self._window_expiry.append((start, prefix))
                if closes_at(start) > reached:
                    open_windows.setdefault(prefix, []).append(start)
                    self._closing_windows.append((start, prefix))
        for key, present in sorted(records.items()):
            if present:
                prefix, timestamp, offset = _split_record_key(key)
                self._kept.setdefault(prefix, []).append((timestamp, offset))
                self._record_expiry.append((timestamp, offset, prefix))
        for kept in self._kept.values():
            kept.sort()
        heapq.heapify(self._window_expiry)
        heapq.heapify(self._record_expiry)
        heapq.heapify(self._closing_windows)
        self._open_windows = open_windows
        return open_windows
