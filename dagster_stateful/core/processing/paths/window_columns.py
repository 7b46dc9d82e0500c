"""A batch of one partition's messages folded per message key and time window, in columns.

Owns `fold_by_window`, the windowed counterpart of `columns.fold_by_key`, for the columnar path of
a windowed aggregation (`vectorized.VectorizedBatchProcessor`). From the messages' timestamps and
the stream time before the batch, NumPy computes what a message at a time would: the stream time
each message sees (the running maximum of event times), the windows each message falls in
(`Windows.starts`), and which of them had already closed when it came (`WindowState.update` skips
those). It then folds the rest per (message key, window start) into one partial each, with the
offset of its last message.

A batch with a message that has no timestamp, or one late for every window it falls in, is
refused (None): the per-message path then gives that message to the error policy (a late one to
`handle_late`) and folds the others as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dagster_stateful.core.processing.dsl.aggregations import Columnar
from dagster_stateful.core.processing.dsl.windows import Windows
from dagster_stateful.core.processing.paths.columns import key_codes, last_of, partials_of

__all__ = ["WindowPartials", "fold_by_window"]


@dataclass(frozen=True)
class WindowPartials:
    """A batch folded per message key and window."""

    keys: list[bytes]
    """The message key of each window folded into."""
    starts: list[int]
    """Each window's start (ms)."""
    partials: list[Any]
    """Each window's partial (a number; [sum, count] for a mean)."""
    last_offsets: list[int]
    """The offset of each window's last message in the batch."""
    stream_time: int
    """The partition's stream time after the batch."""
    advanced_by: int | None
    """The offset of the message that moved stream time to `stream_time` (None: the batch did not move it)."""


def fold_by_window(
    kind: Columnar,
    keys: list[bytes],
    offsets: list[int],
    timestamps: list[int],
    column: np.ndarray | None,
    windows: Windows,
    stream_time: int,
) -> WindowPartials | None:
    """One partial of `kind` per (message key, window) of the batch's windows that were open when
    their messages came; None when the batch must go message by message (see the module's docstring).
    `column` is the decoded field (None for a count); `stream_time` the partition's before the batch."""
    times = np.array(timestamps, np.int64)
    if times.min() < 0:
        return None
    latest = int(times.max())
    seen = np.maximum(np.maximum.accumulate(times), stream_time)
    size, step, grace = windows.size, windows.step, windows.grace
    last_start = times // step * step
    if np.any(last_start + (size + grace) <= seen):
        return None  # a message's latest window closes last: it was closed, so the message is late
    codes, distinct = key_codes(keys)
    rows = [np.arange(len(keys))]
    starts = [last_start]
    for back in range(1, (size - 1) // step + 1):  # a hopping window's earlier windows
        start = last_start - back * step
        open_then = (start >= 0) & (start + size > times) & (start + (size + grace) > seen)
        rows.append(np.flatnonzero(open_then))
        starts.append(start[open_then])
    row, window_start = np.concatenate(rows), np.concatenate(starts)
    start_values, start_codes = np.unique(window_start, return_inverse=True)
    windows_found, groups = np.unique(
        codes[row].astype(np.int64) * len(start_values) + start_codes, return_inverse=True
    )
    count = len(windows_found)
    advanced_by = offsets[int(np.argmax(times))] if latest > stream_time else None  # the first to reach it moved it
    return WindowPartials(
        [distinct[code] for code in (windows_found // len(start_values)).tolist()],
        start_values[windows_found % len(start_values)].tolist(),
        partials_of(kind, groups, count, None if column is None else column[row]),
        last_of(groups, count, np.array(offsets, np.int64)[row]),
        max(stream_time, latest),
        advanced_by,
    )
