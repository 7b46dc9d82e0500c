"""The state of an interval join of two streams: per message key, each side's records within reach.

Owns `IntervalJoinState`, `IntervalJoinBounds` and the join store's layout. The join is Kafka
Streams' `JoinWindows`: a left record at t and a right record at t' join when
t - before <= t' <= t + after. Both sides are kept in one store, each record under a reserved key
(`JOIN_RECORD + side + message prefix + timestamp + offset`, the offset in its own topic), its
value with whether it has joined yet; and the partition's stream time under `STREAM_TIME_KEY`
(the largest event time of either side, as a task's in Kafka Streams).

Timing. A record more than `grace` behind stream time is late: it joins nothing and is not kept.
A record arriving in time joins every record of the other side kept for its key within its
window, at once (one result per pair, sent by whichever of the two came second). A left record
closes once stream time passes t + after + grace, a right one once it passes t' + before + grace:
no record still to come can join it then (one that could would be late). A record of a side
whose unmatched records the join sends (the left side of a left join, both of an outer join) and
that joined nothing is sent alone when it closes, never before. A closed record is deleted, with
a tombstone in the changelog, by the commit after the one whose stream time closed it (see
`window_state`: a deletion decided by uncommitted messages' stream time could lose committed
state).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections import deque
from dataclasses import dataclass
from typing import Any

from dagster_stateful.core.state.cache import StoreCache
from dagster_stateful.core.state.keys import RESERVED_PREFIX, STREAM_TIME_KEY
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.serialization import Serde
from dagster_stateful.core.state.window_state import WindowBounds, WindowState

__all__ = ["JOIN_RECORD", "LEFT", "RIGHT", "IntervalJoinBounds", "IntervalJoinState", "JoinedPair"]

JOIN_RECORD = RESERVED_PREFIX + b"join-record"
LEFT, RIGHT = 0, 1
_TIME_BYTES = 8
_MISSING: Any = object()

JoinedPair = tuple[bytes, Any, Any]
"""A join result: (message key, left value or None, right value or None)."""

_Record = tuple[int, int, bytes]
"""A kept record of one side and message key: (timestamp, offset in its topic, store key)."""
_Entry = tuple[int, bytes, int, bytes, int, int]
"""A kept record by when it closes: (closes after, store key, side, message prefix, timestamp, offset)."""


def record_key(side: int, prefix: bytes, timestamp: int, offset: int) -> bytes:
    """The store key of a record of `side` with the message key of `prefix`."""
    return (
        JOIN_RECORD
        + bytes((side,))
        + prefix
        + timestamp.to_bytes(_TIME_BYTES, "big")
        + offset.to_bytes(_TIME_BYTES, "big", signed=True)
    )


def split_record_key(key: bytes) -> tuple[int, bytes, int, int]:
    """(side, message prefix, timestamp, offset) of a record's store key."""
    body = key[len(JOIN_RECORD) :]
    side, rest = body[0], body[1:]
    prefix, timestamp, offset = rest[: -2 * _TIME_BYTES], rest[-2 * _TIME_BYTES : -_TIME_BYTES], rest[-_TIME_BYTES:]
    return side, prefix, int.from_bytes(timestamp, "big"), int.from_bytes(offset, "big", signed=True)


@dataclass(frozen=True)
class IntervalJoinBounds(WindowBounds):
    """An interval join's reach, in ms: a left record at t joins right records in
    [t - before, t + after]. `size` is before + after (the width of a record's window)."""

    before: int = 0
    after: int = 0
    emits_unmatched: tuple[bool, bool] = (False, False)
    """Whether a left (right) record that joined nothing is sent alone once it closes."""

    def reach(self, side: int) -> tuple[int, int]:
        """How far before and after its own timestamp a record of `side` finds the other side's."""
        return (self.before, self.after) if side == LEFT else (self.after, self.before)

    def closes_after(self, side: int, timestamp: int) -> int:
        """The stream time past which a record of `side` at `timestamp` can join nothing more."""
        return timestamp + self.reach(side)[1] + self.grace

    def is_late(self, timestamp: int, stream_time: int) -> bool:
        return timestamp + self.grace < stream_time


class IntervalJoinState(WindowState):
    """Both sides of an interval join in one store partition, for the current message key and event
    time (bound by the partition transaction).

    In memory: each (side, message prefix)'s kept records, sorted; a heap of the records that are
    sent alone if they close unmatched, by the stream time past which they close; and a heap of
    every kept record by that time, for deletion by a commit."""

    __slots__ = ("_closed", "_join", "_kept", "_open", "right_offset")

    def __init__(self, partition: StorePartition, cache: StoreCache, serde: Serde, bounds: IntervalJoinBounds) -> None:
        self._join = bounds
        self.right_offset = 0
        """The offset of the current right record in the joined stream's topic (set before each)."""
        super().__init__(partition, cache, serde, bounds)

    def forget(self) -> None:
        super().forget()
        self._kept: dict[tuple[int, bytes], list[_Record]] | None = None
        self._open: list[_Entry] = []
        """The kept records stream time has not closed yet, by when they close (a heap)."""
        self._closed: deque[_Entry] = deque()
        """The kept records stream time has closed, in the order they closed, until a commit deletes them."""

    @property
    def next_close(self) -> int | None:
        self._ensure_records()
        return self._open[0][0] + 1 if self._open else None

    @property
    def expiries_due(self) -> bool:
        committed = self._committed_stream_time
        if self._idle_advanced:
            return True
        if self._kept is None or committed is None:
            return False
        return bool(self._closed) and self._closed[0][0] < committed

    def expire_committed(self, offset: int) -> None:
        committed = self._committed_stream_time
        if self._kept is None or committed is None:
            return
        closed, kept = self._closed, self._kept
        delete = self._cache.delete_live
        while closed and closed[0][0] < committed:
            _, key, side, prefix, timestamp, record_offset = closed.popleft()
            mine = kept.get((side, prefix))
            if mine is not None:
                at = bisect_left(mine, (timestamp, record_offset))
                if at < len(mine) and mine[at][2] == key:
                    del mine[at]
                if not mine:
                    del kept[(side, prefix)]
            delete(key, offset)
        self._cache.accept()

    def update(self, starts: list[int], value: Any, first: Any, add: Any) -> Any:
        raise TypeError("an interval join's store is changed with join_record")

    def join_record(self, side: int, value: Any) -> tuple[list[JoinedPair] | None, list[JoinedPair]]:
        """Join `value`, a record of `side` at the current event time (a left record: the current
        message; a right one: at `right_offset` in the joined stream's topic),
        with the other side's records in its window, keep it, and advance stream time. Returns the
        pairs it made (None: the record is late and changed nothing) and the records that stream
        time closed unmatched, sent alone, by the time they closed."""
        kept = self._ensure_records()
        stream_time = self._stream_time
        assert stream_time is not None
        timestamp, prefix, bounds = self.timestamp, self._prefix, self._join
        if bounds.is_late(timestamp, stream_time):
            return None, []
        self._metrics.folds += 1
        message_key = prefix[4:]
        lower, upper = bounds.reach(side)
        other = 1 - side
        pairs: list[JoinedPair] = []
        theirs = kept.get((other, prefix), ())
        other_sent_alone = bounds.emits_unmatched[other]
        low = bisect_left(theirs, (timestamp - lower, -(2**63)))
        high = bisect_right(theirs, (timestamp + upper, 2**63))
        values = self._values
        for _, _, key in theirs[low:high]:
            stored = values.get(key, _MISSING)
            if stored is _MISSING:
                stored = self._load(key)
            if stored is None:
                continue
            pairs.append((message_key, value, stored[0]) if side == LEFT else (message_key, stored[0], value))
            if other_sent_alone and not stored[1]:
                self._cache.put_live(key, [stored[0], True], self._offset)
        offset = self._offset if side == LEFT else self.right_offset
        self._keep(side, prefix, timestamp, offset, value, bool(pairs))
        if timestamp <= stream_time:
            return pairs, []
        self._stream_time = timestamp
        self._cache.put_live(STREAM_TIME_KEY, timestamp, self._offset)
        return pairs, self._close(timestamp)

    def _keep(self, side: int, prefix: bytes, timestamp: int, offset: int, value: Any, joined: bool) -> None:
        assert self._kept is not None
        key = record_key(side, prefix, timestamp, offset)
        mine = self._kept.setdefault((side, prefix), [])
        at = bisect_left(mine, (timestamp, offset))
        if at < len(mine) and mine[at][2] == key:  # a record processed again
            previous = self._read(key)
            joined = joined or (previous is not None and bool(previous[1]))  # it keeps what it found before
        else:
            if at == len(mine):
                mine.append((timestamp, offset, key))
            else:
                mine.insert(at, (timestamp, offset, key))
            heapq.heappush(self._open, (self._join.closes_after(side, timestamp), key, side, prefix, timestamp, offset))
        stored = [value, joined]
        if not self._checked:
            self._serialize(key, stored)  # a partition's first record: refused here, not at every commit
            self._checked = True
        self._cache.put_live(key, stored, self._offset)

    def _closed_by(self, stream_time: int) -> list[Any]:
        return self._close(stream_time)

    def _close(self, stream_time: int) -> list[JoinedPair]:
        """The records of the sides sent alone that stream time closed unmatched; every record it
        closed moves to those a commit deletes."""
        opened, closed, alone, unmatched = self._open, self._closed, [], self._join.emits_unmatched
        while opened and opened[0][0] < stream_time:
            entry = heapq.heappop(opened)
            closed.append(entry)
            side, prefix = entry[2], entry[3]
            if not unmatched[side]:
                continue
            stored = self._read(entry[1])
            if stored is not None and not stored[1]:
                alone.append((prefix[4:], stored[0], None) if side == LEFT else (prefix[4:], None, stored[0]))
        return alone

    def _ensure_records(self) -> dict[tuple[int, bytes], list[_Record]]:
        """The kept records by side and message prefix, when not known: those in RocksDB, as the
        record cache has changed them since the last commit."""
        if self._kept is not None:
            return self._kept
        present: dict[bytes, bool] = {}
        stream_time = -1
        for key, data in self._partition.items():
            if key == STREAM_TIME_KEY:
                stream_time = self._decode(data)
            elif key.startswith(JOIN_RECORD):
                present[key] = True
        for key, value in self._values.items():
            if key == STREAM_TIME_KEY:
                stream_time = value
            elif key.startswith(JOIN_RECORD):
                present[key] = value is not None
        reached = self._stream_time = self._reconcile_stream_time(stream_time)
        kept: dict[tuple[int, bytes], list[_Record]] = {}
        closing: list[_Entry] = []
        bounds = self._join
        for key, here in sorted(present.items()):
            if not here:
                continue
            side, prefix, timestamp, offset = split_record_key(key)
            kept.setdefault((side, prefix), []).append((timestamp, offset, key))
            entry = (bounds.closes_after(side, timestamp), key, side, prefix, timestamp, offset)
            (self._open if entry[0] >= reached else closing).append(entry)
        for records in kept.values():
            records.sort()
        heapq.heapify(self._open)
        self._closed = deque(sorted(closing))
        self._kept = kept
        return kept

    def _ensure_index(self) -> dict[int, set[bytes]]:
        self._ensure_records()
        return {}
