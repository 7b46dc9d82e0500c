"""Sliding windows recomputed the plain way, as the judge of the engine's: never the code under test.

`replay_sliding` takes one partition's records in offset order and returns every window that
closed (with the values it holds), the windows not past their retention, the records that came
late and the partition's stream time, by the definitions `docs/apps.md` gives (Kafka Streams'
`SlidingWindows`): windows [s, s + d], both ends inclusive; a key's windows start at max(0, t - d)
for each of its records t (left windows) and at t + 1 for each record with a later record of its
key at most d + 1 after it (right windows); a window comes into being when its records first
define it, and only when it is open then (stream time not past s + d + grace); from then on it
holds every record of its key in its bounds that is not late, until it closes; a record is late
when t + d + grace is behind stream time.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

WindowId = tuple[str, int]
"""(message key, start)."""


@dataclass
class ReplayedSliding:
    closed: dict[WindowId, list[Any]] = field(default_factory=dict)
    """Every window that closed, with its values in offset order, by key and start."""
    kept: dict[WindowId, list[Any]] = field(default_factory=dict)
    """Every window not past its retention at the end (closed or not)."""
    late: list[int] = field(default_factory=list)
    """Indexes of the late records, in the order given."""
    stream_time: int = -1


def replay_sliding(
    records: Iterable[tuple[str, int, Any]], difference: int, grace: int, retention: int | None = None
) -> ReplayedSliding:
    """(key, timestamp, value) records of one partition, in offset order."""
    retention = difference + grace + 1 if retention is None else retention
    replayed = ReplayedSliding()
    accepted: dict[str, list[tuple[int, Any]]] = {}
    windows: dict[WindowId, list[Any]] = {}
    by_key: dict[str, dict[int, list[Any]]] = {}
    """The same windows, per key."""
    still_open: set[WindowId] = set()
    stream_time = -1

    def is_open(start: int, at: int) -> bool:
        return start + difference + grace >= at

    for index, (key, timestamp, value) in enumerate(records):
        if timestamp + difference + grace < stream_time:
            replayed.late.append(index)
            continue
        horizon = max(stream_time, timestamp)
        for start, values in by_key.setdefault(key, {}).items():
            if start <= timestamp <= start + difference and is_open(start, horizon):
                values.append(value)
        mine = accepted.setdefault(key, [])
        mine.append((timestamp, value))
        times = sorted(t for t, _ in mine)
        # The starts the record can add to the definition's: its left window, its right window (when
        # a later record is within reach), and the right window of each earlier record it is within
        # reach of (the only ones whose condition it changes).
        starts = {max(0, timestamp - difference)}
        after = times[bisect_right(times, timestamp) :]
        if after and after[0] <= timestamp + 1 + difference:
            starts.add(timestamp + 1)
        starts |= {t + 1 for t in times[bisect_left(times, timestamp - 1 - difference) : bisect_left(times, timestamp)]}
        for start in sorted(starts):
            if (key, start) not in windows and is_open(start, horizon):
                windows[(key, start)] = by_key[key][start] = [v for t, v in mine if start <= t <= start + difference]
                still_open.add((key, start))
        if timestamp > stream_time:
            stream_time = timestamp
            for window in [window for window in still_open if not is_open(window[1], stream_time)]:
                replayed.closed[window] = list(windows[window])
                still_open.discard(window)
    replayed.stream_time = stream_time
    replayed.kept = {window: values for window, values in windows.items() if window[1] + retention > stream_time}
    return replayed
