"""A batch of one partition's messages folded per message key and time window, in columns.

Owns `fold_by_window`, the windowed counterpart of `columns.fold_by_key`, for the columnar path of
a windowed aggregation (`vectorized.VectorizedBatchProcessor`). From the messages' timestamps and
the stream time before the batch, Arrow computes what a message at a time would: the stream time
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

import pyarrow as pa
import pyarrow.compute as pc

from dagster_stateful.core.processing.aggregations import Columnar
from dagster_stateful.core.processing.columns import ARROW_AGGREGATIONS, partials_of
from dagster_stateful.core.processing.windows import Windows

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
    column: pa.Array | None,
    windows: Windows,
    stream_time: int,
) -> WindowPartials | None:
    """One partial of `kind` per (message key, window) of the batch's windows that were open when
    their messages came; None when the batch must go message by message (see the module's docstring).
    `column` is the decoded field (None for a count); `stream_time` the partition's before the batch."""
    times = pa.array(timestamps, pa.int64())
    latest = pc.max(times).as_py()
    if pc.min(times).as_py() < 0:
        return None
    seen = pc.max_element_wise(pc.cumulative_max(times), pa.scalar(stream_time, pa.int64()))
    size, step, grace = windows.size, windows.step, windows.grace
    last_start = pc.multiply(pc.divide(times, step), step)  # event times are not negative: division floors
    if pc.any(pc.less_equal(pc.add(last_start, size + grace), seen)).as_py():
        return None  # a message's latest window closes last: it was closed, so the message is late
    rows = {"key": pa.array(keys, pa.binary()), "offset": pa.array(offsets, pa.int64())}
    if column is not None:
        rows["value"] = column
    pieces = [pa.table({**rows, "start": last_start})]
    for back in range(1, (size - 1) // step + 1):  # a hopping window's earlier windows
        start = pc.subtract(last_start, back * step)
        open_then = pc.and_(
            pc.and_(pc.greater_equal(start, 0), pc.greater(pc.add(start, size), times)),
            pc.greater(pc.add(start, size + grace), seen),
        )
        pieces.append(pa.table({**rows, "start": start}).filter(open_then))
    table = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
    grouped = table.group_by(["key", "start"], use_threads=False).aggregate(
        [("offset", "max"), *ARROW_AGGREGATIONS[kind]]
    )
    advanced_by = None
    if latest > stream_time:
        advanced_by = offsets[pc.index(times, latest).as_py()]  # the first to reach it is the last to move it
    return WindowPartials(
        grouped.column("key").to_pylist(),
        grouped.column("start").to_pylist(),
        partials_of(kind, grouped),
        grouped.column("offset_max").to_pylist(),
        max(stream_time, latest),
        advanced_by,
    )
