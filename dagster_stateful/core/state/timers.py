"""Timers: per-key callbacks due at a stream time or a wall-clock time, kept in a store.

Owns `Timer`, `TimerQueue` and the timers' records. A timer belongs to one message key and has a
name (scheduling the name again moves it). It lives in the store of the steps that schedule it, as
two records outside every message key's scope (`keys.is_reserved`, so readers of the store pass
them by, as they pass its stream time): `TIMER_DUE + kind + due + message prefix + name`, the queue
in due order, and `TIMER_OF_KEY + message prefix + name` -> kind + due, to move or cancel it. Both
go through the record cache and the changelog, so a timer survives a crash, a rebalance and a
restore, and a failed message's scheduling is undone with its other writes.

A stream-time timer is due once the partition's stream time (the largest message timestamp it has
seen, kept under `STREAM_TIME_KEY` and in the commit, as an expiring store's) reaches it; a
wall-clock timer once the machine's clock does. A timer fires once per due time under
exactly-once: it is deleted in the transaction of its callback's writes and results. Under
at-least-once it is deleted by the first commit after the one that carried its firing, so a crash
before that commit fires it again (never never): a deletion written before its results were safe
could be all a restore keeps of it.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from dagster_stateful.core.state.cache import StoreCache
from dagster_stateful.core.state.keys import RESERVED_PREFIX, STREAM_TIME_KEY, message_prefix
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.stream_time import CommittedStreamTime, decode_stream_time, encode_stream_time

__all__ = ["TIMER_DUE", "TIMER_OF_KEY", "Timer", "TimerQueue"]

TIMER_DUE = RESERVED_PREFIX + b"timer-due"
TIMER_OF_KEY = RESERVED_PREFIX + b"timer-key"
_STREAM, _WALL = b"s", b"w"
_DUE_BYTES = 8
_PRESENT = b"1"

_Entry = tuple[int, bytes]
"""A timer in a queue: (due, its `TIMER_DUE` record's key)."""


@dataclass(frozen=True)
class Timer:
    """A timer that fired: whose it is, its name, when it was due (ms) and by which clock."""

    key: bytes
    """The message key it belongs to (as the message carried it)."""
    name: str
    due: int
    wall_clock: bool


def _due_key(kind: bytes, due: int, prefix: bytes, name: bytes) -> bytes:
    return TIMER_DUE + kind + due.to_bytes(_DUE_BYTES, "big") + prefix + name


def _parse_due_key(key: bytes) -> Timer:
    at = len(TIMER_DUE)
    kind, due = key[at : at + 1], int.from_bytes(key[at + 1 : at + 1 + _DUE_BYTES], "big")
    rest = key[at + 1 + _DUE_BYTES :]
    length = int.from_bytes(rest[:4], "big")
    return Timer(rest[4 : 4 + length], rest[4 + length :].decode(), due, kind == _WALL)


class TimerQueue(CommittedStreamTime):
    """The timers of one store partition, in due order, and the partition's stream time."""

    __slots__ = (
        "_cache",
        "_committed_stream_time",
        "_delete_on_fire",
        "_fired",
        "_fired_since_commit",
        "_partition",
        "_queues",
        "_stored_stream_time",
        "_stream_time",
        "_to_delete",
    )

    def __init__(self, partition: StorePartition, cache: StoreCache, delete_on_fire: bool) -> None:
        """delete_on_fire: delete a timer with its firing (exactly-once), not at the commit after (at-least-once)."""
        self._partition = partition
        self._cache = cache
        self._delete_on_fire = delete_on_fire
        self._committed_stream_time: int | None = None
        self._to_delete: list[bytes] = []
        """Timers whose firing a commit carried (at-least-once): the next commit deletes them."""
        self.forget()

    def forget(self) -> None:
        """Drop what is known in memory (after a roll-back): read again when next needed. Timers
        fired since the last commit fire again; those waiting to be deleted stay so."""
        self._queues: dict[bytes, list[_Entry]] | None = None
        self._stream_time: int | None = None
        self._stored_stream_time = -1
        self._fired: dict[bytes, None] = {}
        """Timers fired since the last commit and not deleted yet (at-least-once), in firing order."""
        self._fired_since_commit = 0

    # stream time -------------------------------------------------------------------------------

    @property
    def stream_time(self) -> int:
        """The largest message timestamp this partition has seen (-1: none yet)."""
        if self._stream_time is None:
            data = self._cache.values.get(STREAM_TIME_KEY)
            if data is None:
                data = self._partition.get(STREAM_TIME_KEY)
            found = decode_stream_time(data)
            self._stored_stream_time = found
            self._stream_time = self._settle_stream_time(found, STREAM_TIME_KEY in self._cache.dirty)
        return self._stream_time

    def observe(self, timestamp: int) -> None:
        """A message's timestamp (ms): stream time moves up to it."""
        if timestamp > self.stream_time:
            self._stream_time = timestamp

    @property
    def stream_time_to_commit(self) -> int | None:
        return self.stream_time

    @property
    def expiries_due(self) -> bool:
        """Whether the next commit has work even without new messages: timers fired (by the clock)
        since the last commit, or timers whose firing a commit carried, to delete."""
        return self._fired_since_commit > 0 or bool(self._to_delete)

    # scheduling --------------------------------------------------------------------------------

    def schedule(self, prefix: bytes, name: str, due: int, wall_clock: bool, offset: int) -> None:
        """Schedule (or move) the timer `name` of the message key of `prefix`, as a write of the
        message at source `offset` (undone if that message fails)."""
        kind = _WALL if wall_clock else _STREAM
        queue = self._queue(kind)  # loaded before this write, which it would otherwise hold twice
        self.cancel(prefix, name, offset)
        key = _due_key(kind, due, prefix, name.encode())
        self._cache.put(TIMER_OF_KEY + prefix + name.encode(), key, offset)
        self._cache.put(key, _PRESENT, offset)
        heapq.heappush(queue, (due, key))

    def cancel(self, prefix: bytes, name: str, offset: int) -> bool:
        """Cancel the timer `name` of the message key of `prefix`; whether there was one."""
        owner = TIMER_OF_KEY + prefix + name.encode()
        current = self._read(owner)
        if current is None:
            return False
        self._cache.put(owner, None, offset)
        self._cache.put(current, None, offset)
        return True

    def due_of(self, prefix: bytes, name: str) -> tuple[int, bool] | None:
        """(due, wall_clock) of the timer `name` of the message key of `prefix`, if scheduled."""
        current = self._read(TIMER_OF_KEY + prefix + name.encode())
        if current is None:
            return None
        timer = _parse_due_key(current)
        return timer.due, timer.wall_clock

    # firing --------------------------------------------------------------------------------------

    def next_due(self, wall_clock: bool) -> int | None:
        """When the next timer of that clock is due (None: none is scheduled)."""
        queue = self._queue(_WALL if wall_clock else _STREAM)
        while queue:
            due, key = queue[0]
            if self._read(key) is not None and key not in self._fired:
                return due
            heapq.heappop(queue)
        return None

    def pop_due(self, wall_clock: bool, now: int) -> list[Timer]:
        """The timers of that clock due at `now` (a stream time or a wall-clock time), in due order,
        taken out of the queue; each must then be `fired`."""
        queue, due_now = self._queue(_WALL if wall_clock else _STREAM), dict[bytes, None]()
        while queue and queue[0][0] <= now:
            _, key = heapq.heappop(queue)
            if self._read(key) is not None and key not in self._fired:
                due_now[key] = None  # once, though scheduled again at the same time
        return [_parse_due_key(key) for key in due_now]

    def fired(self, timer: Timer, offset: int) -> None:
        """`timer`'s callback ran, as a write of source `offset`: it is deleted now (exactly-once)
        or by the commit after the next one (at-least-once)."""
        key = _due_key(_WALL if timer.wall_clock else _STREAM, timer.due, message_prefix(timer.key), _name(timer))
        self._fired_since_commit += 1
        if self._delete_on_fire:
            self._delete(key, offset)
        else:
            self._fired[key] = None

    def prepare(self, offset: int) -> None:
        """Before a commit: delete the timers whose firing the last commit carried, and keep the
        stream time reached, as writes of source `offset`."""
        for key in self._to_delete:
            self._delete(key, offset)
        stream_time = self.stream_time
        if stream_time > self._stored_stream_time:
            self._cache.put(STREAM_TIME_KEY, encode_stream_time(stream_time), offset)
            self._stored_stream_time = stream_time
        self._cache.accept()

    def committed(self) -> None:
        """The commit went through: what it deleted is gone; what fired in it is deleted next time."""
        self._to_delete = list(self._fired)
        self._fired = {}
        self._fired_since_commit = 0
        self.mark_committed()

    def _delete(self, key: bytes, offset: int) -> None:
        """Delete the timer of `TIMER_DUE` record `key` (its owner record too, unless moved since)."""
        timer = _parse_due_key(key)
        owner = TIMER_OF_KEY + message_prefix(timer.key) + _name(timer)
        if self._read(owner) == key:
            self._cache.put(owner, None, offset)
        if self._read(key) is not None:
            self._cache.put(key, None, offset)

    def _read(self, key: bytes) -> bytes | None:
        values = self._cache.values
        if key in values:
            return values[key]
        data = self._partition.get(key)
        self._cache.remember(key, data)
        return data

    def _queue(self, kind: bytes) -> list[_Entry]:
        if self._queues is None:
            self._queues = self._load()
        return self._queues[kind]

    def _load(self) -> dict[bytes, list[_Entry]]:
        """Every scheduled timer, from RocksDB as the record cache has changed it, but those fired
        in a committed transaction and waiting for their deletion."""
        found: dict[bytes, bool] = {}
        for key, _ in self._partition.items(TIMER_DUE):
            if not key.startswith(TIMER_DUE):
                break
            found[key] = True
        for key, value in self._cache.values.items():
            if key.startswith(TIMER_DUE):
                found[key] = value is not None
        waiting = set(self._to_delete)
        queues: dict[bytes, list[_Entry]] = {_STREAM: [], _WALL: []}
        for key, present in found.items():
            if present and key not in waiting:
                timer = _parse_due_key(key)
                queues[_WALL if timer.wall_clock else _STREAM].append((timer.due, key))
        for queue in queues.values():
            heapq.heapify(queue)
        return queues


def _name(timer: Timer) -> bytes:
    return timer.name.encode()
