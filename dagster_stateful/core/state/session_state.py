"""The state of a session-window aggregation: per message key, its sessions of activity and their aggregates.

Owns `SessionState`, `SessionBounds` and the session store's layout. A session is the span
[start, end] (ms, both inclusive) of a key's records no two of which are more than the inactivity
gap apart. A session store keeps each session under `window_key(start, message prefix)` (so
sessions sort by start, as a window store's windows do) with `[end, aggregate]` as its value, and
the partition's stream time under `STREAM_TIME_KEY`. Everything goes through the live record cache
and the changelog, and is restored from it.

A record at `t` joins every session of its key that ends at or after `t - gap` and starts at or
before `t + gap`: one it extends, or two or more it bridges, which become one (their aggregates
combined in start order, then the record added; the sessions merged away are deleted, with
tombstones). A record more than the grace behind stream time is late. A session closes once stream
time passes its end plus gap plus grace: no record still on time can then reach it (it would be
more than the gap after its end), so a closed session is final and never merged again. It expires
once the stream time of a commit passes its end plus the retention (at least gap plus grace), and
the next commit deletes it, as a window store does with its windows (see `window_state`).
"""

from __future__ import annotations

import heapq
from bisect import insort
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dagster_stateful.core.state.cache import StoreCache
from dagster_stateful.core.state.keys import STREAM_TIME_KEY
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.serialization import Serde
from dagster_stateful.core.state.window_state import WindowBounds, WindowState, window_key
from dagster_stateful.errors import StateStoreError

__all__ = ["Session", "SessionBounds", "SessionState"]

_START_BYTES = 8

Session = tuple[bytes, int, int, Any]
"""A session of one message key: (message key, start, end, aggregate)."""

_Due = tuple[int, int, bytes]
"""A session waiting to close or expire: (end, start, message prefix)."""


@dataclass(frozen=True)
class SessionBounds:
    """How a session store's sessions grow, close and expire, in ms of event time."""

    gap: int
    grace: int
    retention: int

    def is_late(self, timestamp: int, stream_time: int) -> bool:
        """Whether a record at `timestamp` comes too late to count, at `stream_time`."""
        return timestamp < stream_time - self.grace

    def is_closed(self, end: int, stream_time: int) -> bool:
        """Whether the session ending at `end` is closed (final) at `stream_time`."""
        return end + self.gap + self.grace < stream_time


class SessionState(WindowState):
    """The sessions of one session store partition, for the current message key and event time
    (bound by the partition transaction)."""

    __slots__ = ("_ending", "_gap", "_late", "_open", "_session_closed", "_session_retention", "_sessions")

    def __init__(self, partition: StorePartition, cache: StoreCache, serde: Serde, bounds: SessionBounds) -> None:
        self._gap = bounds.gap
        self._late = bounds.is_late
        self._session_closed = bounds.is_closed
        self._session_retention = bounds.retention
        super().__init__(partition, cache, serde, WindowBounds(0, bounds.grace, bounds.retention))

    def forget(self) -> None:
        super().forget()
        self._sessions: dict[bytes, list[tuple[int, int]]] | None = None
        """Each message prefix's live sessions as (start, end), by start."""
        self._ending: list[_Due] = []
        """Every live session (a heap; entries of sessions since merged or grown are skipped)."""
        self._open: list[_Due] = []
        """Every session not closed yet (a heap, skipped alike)."""

    @property
    def stream_time(self) -> int:
        self._ensure_sessions()
        assert self._stream_time is not None
        return self._stream_time

    @property
    def expiries_due(self) -> bool:
        committed = self._committed_stream_time
        if self._sessions is None or committed is None:
            return False
        ending = self._ending
        self._drop_stale(ending)
        return bool(ending) and ending[0][0] + self._session_retention < committed

    def expire_committed(self, offset: int) -> None:
        committed, sessions = self._committed_stream_time, self._sessions
        if sessions is None or committed is None:
            return
        ending, retention = self._ending, self._session_retention
        while ending and ending[0][0] + retention < committed:
            end, start, prefix = heapq.heappop(ending)
            live = sessions.get(prefix)
            if live and (start, end) in live:
                live.remove((start, end))
                self._cache.delete_live(window_key(start, prefix), offset)
        self._cache.accept()

    def update_session(
        self,
        value: Any,
        first: Callable[[Any], Any],
        add: Callable[[Any, Any], Any],
        combine: Callable[[Any, Any], Any],
    ) -> tuple[tuple[int, int, Any] | None, list[int], list[Session]]:
        """Fold `value`, at the current event time, into the current key's session it falls in
        (merging the sessions it bridges), and advance stream time. Returns (start, end, aggregate)
        of the session updated (None: the record is late and changed nothing), the starts of the
        sessions merged into it under another start, and the sessions that closed, by end."""
        sessions = self._ensure_sessions()
        stream_time = self._stream_time
        assert stream_time is not None
        timestamp, prefix = self.timestamp, self._prefix
        if self._late(timestamp, stream_time):
            return None, [], []
        self._metrics.folds += 1
        mine = sessions.get(prefix, [])
        low, high = timestamp - self._gap, timestamp + self._gap
        joined = [session for session in mine if session[1] >= low and session[0] <= high]
        if joined:
            start, end = min(timestamp, joined[0][0]), max(timestamp, max(e for _, e in joined))
            aggregate = add(self._combined(joined, combine), value)
            merged = [s for s, _ in joined if s != start]
            for merged_start in merged:
                self._cache.delete_live(window_key(merged_start, prefix), self._offset)
            mine = [session for session in mine if session not in joined]
        else:
            start = end = timestamp
            aggregate = first(value)
            merged = []
        self._keep(prefix, mine, start, end, aggregate, joined != [(start, end)])
        if timestamp <= stream_time:
            return (start, end, aggregate), merged, []
        self._stream_time = timestamp
        self._cache.put_live(STREAM_TIME_KEY, timestamp, self._offset)
        return (start, end, aggregate), merged, self._close_sessions(timestamp)

    def _combined(self, joined: list[tuple[int, int]], combine: Callable[[Any, Any], Any]) -> Any:
        """The aggregates of the current key's sessions `joined`, combined in start order."""
        prefix = self._prefix
        aggregate: Any = None
        for start, _ in joined:
            stored = self._read(window_key(start, prefix))
            if stored is None:
                self._missing(start)
            aggregate = stored[1] if aggregate is None else combine(aggregate, stored[1])
        return aggregate

    def _missing(self, start: int) -> None:
        raise StateStoreError(
            f"store {self._partition.store!r} partition {self._partition.partition}: the session starting at "
            f"{start} is indexed but not stored; the store is damaged: clear the partition's state to restore it"
        )

    def _keep(
        self, prefix: bytes, others: list[tuple[int, int]], start: int, end: int, aggregate: Any, moved: bool
    ) -> None:
        """Keep the current key's session [start, end] beside its `others`; `moved`: its span is new
        (it is then due to close and expire at its end)."""
        if aggregate is None:
            raise ValueError("the aggregator returned None; an aggregate must be a value the state serializer encodes")
        key, stored = window_key(start, prefix), [end, aggregate]
        if not self._checked:
            self._serialize(key, stored)  # a partition's first session: refused here, not at every commit
            self._checked = True
        self._cache.put_live(key, stored, self._offset)
        insort(others, (start, end))
        assert self._sessions is not None
        self._sessions[prefix] = others
        if moved:
            heapq.heappush(self._open, (end, start, prefix))
            heapq.heappush(self._ending, (end, start, prefix))

    def _close_sessions(self, stream_time: int) -> list[Session]:
        closing, closed = self._open, []
        sessions = self._sessions
        assert sessions is not None
        while closing and self._session_closed(closing[0][0], stream_time):
            end, start, prefix = heapq.heappop(closing)
            if (start, end) not in sessions.get(prefix, ()):
                continue  # merged or grown since
            stored = self._read(window_key(start, prefix))
            if stored is not None:
                closed.append((prefix[4:], start, end, stored[1]))
        return closed

    def _drop_stale(self, heap: list[_Due]) -> None:
        """Pop the entries at the head of `heap` whose session was merged or grown since."""
        sessions = self._sessions
        assert sessions is not None
        while heap:
            end, start, prefix = heap[0]
            if (start, end) in sessions.get(prefix, ()):
                return
            heapq.heappop(heap)

    def _ensure_sessions(self) -> dict[bytes, list[tuple[int, int]]]:
        """The live sessions by message prefix, when not known: those in RocksDB, as the record cache
        has changed them since the last commit."""
        if self._sessions is not None:
            return self._sessions
        found: dict[bytes, int | None] = {}
        stream_time = -1
        for key, data in self._partition.items():
            if key == STREAM_TIME_KEY:
                stream_time = self._decode(data)
            else:
                found[key] = self._decode(data)[0]
        for key, value in self._values.items():
            if key == STREAM_TIME_KEY:
                stream_time = value
            elif key in found or value is not None:
                found[key] = None if value is None else value[0]
        sessions: dict[bytes, list[tuple[int, int]]] = {}
        for key, end in sorted(found.items()):
            if end is not None:
                sessions.setdefault(key[_START_BYTES:], []).append((int.from_bytes(key[:_START_BYTES], "big"), end))
        self._sessions = sessions
        reached = self._stream_time = self._reconcile_stream_time(stream_time)
        due = [(end, start, prefix) for prefix, spans in sessions.items() for start, end in spans]
        heapq.heapify(due)
        self._ending = due
        self._open = [entry for entry in due if not self._session_closed(entry[0], reached)]
        heapq.heapify(self._open)
        return sessions
