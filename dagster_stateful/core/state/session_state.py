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
    """How a session store's sessions grow, close and expire, in ms of event time (a record more than
    `grace` behind stream time is late)."""

    gap: int
    grace: int
    retention: int

    def is_closed(self, end: int, stream_time: int) -> bool:
        """Whether the session ending at `end` is closed (final) at `stream_time`."""
        return end + self.gap + self.grace < stream_time


class SessionState(WindowState):
    """The sessions of one session store partition, for the current message key and event time
    (bound by the partition transaction).

    In memory, only the sessions still open are indexed by key (`_sessions`): a closed one can
    never be joined again. A heap of open sessions by end (`_open`) finds those that close; an
    entry is pushed when a session starts (or its start moves), not each time its end grows: a
    popped entry whose session has grown since is pushed again at its current end. Closed sessions
    wait in a heap by end (`_ending`) for the commit that expires them."""

    __slots__ = (
        "_closes_after",
        "_ending",
        "_gap",
        "_grace",
        "_open",
        "_session_closed",
        "_session_retention",
        "_sessions",
    )

    def __init__(self, partition: StorePartition, cache: StoreCache, serde: Serde, bounds: SessionBounds) -> None:
        self._gap, self._grace = bounds.gap, bounds.grace
        self._closes_after = bounds.gap + bounds.grace
        """A session is closed once stream time passes its end plus this."""
        self._session_closed = bounds.is_closed
        self._session_retention = bounds.retention
        super().__init__(partition, cache, serde, WindowBounds(0, bounds.grace, bounds.retention))

    def forget(self) -> None:
        super().forget()
        self._sessions: dict[bytes, list[list[int]]] | None = None
        """Each message prefix's open sessions as [start, end], by start."""
        self._open: list[_Due] = []
        """Open sessions by their end when pushed (a heap; see the class)."""
        self._ending: list[_Due] = []
        """Closed sessions by end (a heap), until a commit expires them."""

    @property
    def stream_time(self) -> int:
        self._ensure_sessions()
        assert self._stream_time is not None
        return self._stream_time

    @property
    def expiries_due(self) -> bool:
        committed, ending = self._committed_stream_time, self._ending
        return self._idle_advanced or (
            self._sessions is not None
            and committed is not None
            and bool(ending)
            and ending[0][0] + self._session_retention < committed
        )

    def expire_committed(self, offset: int) -> None:
        committed = self._committed_stream_time
        if self._sessions is None or committed is None:
            return
        ending, retention = self._ending, self._session_retention
        while ending and ending[0][0] + retention < committed:
            end, start, prefix = heapq.heappop(ending)
            key = window_key(start, prefix)
            stored = self._read(key)
            if stored is not None and stored[0] == end:
                self._cache.delete_live(key, offset)
        self._cache.accept()

    @property
    def next_close(self) -> int | None:
        """The stream time at which the open session ending first closes, or earlier (an entry may
        stand for a session that has grown since); None: none is open."""
        self._ensure_sessions()
        return self._open[0][0] + self._closes_after + 1 if self._open else None

    def _closed_by(self, stream_time: int) -> list[Any]:
        return self._close_sessions(stream_time)

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
        if timestamp < stream_time - self._grace:  # late: more than the grace behind stream time
            return None, [], []
        self._metrics.folds += 1
        mine = sessions.get(prefix)
        if mine is None:
            mine = sessions[prefix] = []
        low, high = timestamp - self._gap, timestamp + self._gap
        joined = [session for session in mine if session[1] >= low and session[0] <= high]
        merged: list[int] = []
        if len(joined) == 1 and joined[0][0] <= timestamp:  # the usual case: one session grows, or not
            session = joined[0]
            start = session[0]
            stored = self._stored(start)
            aggregate = add(stored[1], value)
            if timestamp > session[1]:
                session[1] = timestamp
            end = session[1]
        elif joined:
            start, end = min(timestamp, joined[0][0]), max(timestamp, max(s[1] for s in joined))
            aggregate = self._stored(joined[0][0])[1]
            for other in joined[1:]:
                aggregate = combine(aggregate, self._stored(other[0])[1])
            aggregate = add(aggregate, value)
            merged = [s[0] for s in joined if s[0] != start]
            for merged_start in merged:
                self._cache.delete_live(window_key(merged_start, prefix), self._offset)
            mine[:] = [s for s in mine if s not in joined]
            insort(mine, [start, end])
            heapq.heappush(self._open, (end, start, prefix))
        else:
            start = end = timestamp
            aggregate = first(value)
            insort(mine, [start, end])
            heapq.heappush(self._open, (end, start, prefix))
        self._keep(window_key(start, prefix), end, aggregate)
        if timestamp <= stream_time:
            return (start, end, aggregate), merged, []
        self._stream_time = timestamp
        self._cache.put_live(STREAM_TIME_KEY, timestamp, self._offset)
        return (start, end, aggregate), merged, self._close_sessions(timestamp)

    def _stored(self, start: int) -> Any:
        """The current key's stored [end, aggregate] of its session starting at `start`."""
        stored = self._read(window_key(start, self._prefix))
        if stored is None:
            raise StateStoreError(
                f"store {self._partition.store!r} partition {self._partition.partition}: the session starting at "
                f"{start} is indexed but not stored; the store is damaged: clear the partition's state to restore it"
            )
        return stored

    def _keep(self, key: bytes, end: int, aggregate: Any) -> None:
        if aggregate is None:
            raise ValueError("the aggregator returned None; an aggregate must be a value the state serializer encodes")
        stored = [end, aggregate]
        if not self._checked:
            self._serialize(key, stored)  # a partition's first session: refused here, not at every commit
            self._checked = True
        self._cache.put_live(key, stored, self._offset)

    def _close_sessions(self, stream_time: int) -> list[Session]:
        """The open sessions that stream time has closed, by end, taken out of the index."""
        opened, sessions, closed = self._open, self._sessions, []
        assert sessions is not None
        closing_before = stream_time - self._closes_after  # `SessionBounds.is_closed`
        while opened and opened[0][0] < closing_before:
            _, start, prefix = heapq.heappop(opened)
            mine = sessions.get(prefix, ())
            session = next((s for s in mine if s[0] == start), None)
            if session is None:
                continue  # merged away, or its start moved: another entry stands for it
            end = session[1]
            if end >= closing_before:
                heapq.heappush(opened, (end, start, prefix))  # grown since it was pushed
                continue
            mine.remove(session)  # type: ignore[union-attr]
            stored = self._read(window_key(start, prefix))
            if stored is not None:
                closed.append((prefix[4:], start, end, stored[1]))
            heapq.heappush(self._ending, (end, start, prefix))
        closed.sort(key=lambda found: (found[2], found[1], found[0]))
        return closed

    def _ensure_sessions(self) -> dict[bytes, list[list[int]]]:
        """The open sessions by message prefix, when not known: those in RocksDB, as the record cache
        has changed them since the last commit (the closed ones wait for their expiry)."""
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
        reached = self._stream_time = self._reconcile_stream_time(stream_time)
        sessions: dict[bytes, list[list[int]]] = {}
        opened: list[_Due] = []
        ending: list[_Due] = []
        for key, end in sorted(found.items()):
            if end is None:
                continue
            start, prefix = int.from_bytes(key[:_START_BYTES], "big"), key[_START_BYTES:]
            if self._session_closed(end, reached):
                ending.append((end, start, prefix))
            else:
                sessions.setdefault(prefix, []).append([start, end])
                opened.append((end, start, prefix))
        heapq.heapify(opened)
        heapq.heapify(ending)
        self._sessions, self._open, self._ending = sessions, opened, ending
        return sessions
