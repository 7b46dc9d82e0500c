"""The stream time of a store that keeps one, against the stream time of the partition's last commit.

Owns `CommittedStreamTime`, the mixin of the stores whose deletions follow stream time
(`ttl.TtlState`, `window_state.WindowState`): the stream time processing has reached (`_stream_time`,
None until read from the store) and the one the partition's last commit recorded
(`committed_stream_time`). The latter comes from the commit itself (`start_from`, see
`processing.commit_metadata`) and wins over the store's, unless the transaction has moved stream
time since (`_settle_stream_time`); a successful commit makes the stream time reached the
committed one (`mark_committed`). Deletions are decided by the committed stream time only: one
decided by the stream time of messages a crash might leave uncommitted could remove a committed
value from the compacted changelog.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["CommittedStreamTime", "decode_stream_time", "encode_stream_time"]


def encode_stream_time(stream_time: int) -> bytes:
    """A key-value store's stored stream time (`keys.STREAM_TIME_KEY`'s value; a window store's is its serde's)."""
    return stream_time.to_bytes(8, "big", signed=True)


def decode_stream_time(data: bytes | None) -> int:
    return -1 if data is None else int.from_bytes(data, "big", signed=True)


class _Clocked(Protocol):
    """What the class using `CommittedStreamTime` holds (in its `__slots__`)."""

    _stream_time: int | None
    """The largest timestamp the partition has seen (None: not known yet; read with the store)."""
    _committed_stream_time: int | None
    """The stream time of the partition's last commit (None: not known yet; read with the store)."""


class CommittedStreamTime:
    """Stream time reached and stream time committed, for a store view (a mixin: the class using it
    declares `_stream_time` and `_committed_stream_time` in its `__slots__`)."""

    __slots__ = ()

    def start_from(self: _Clocked, committed_stream_time: int | None) -> None:
        """The stream time the partition's last commit recorded (None: the commit recorded none, so the
        store's own is taken): processing starts from it, whatever a restore found in the store."""
        self._committed_stream_time = committed_stream_time

    @property
    def committed_stream_time(self: _Clocked) -> int | None:
        return self._committed_stream_time

    def mark_committed(self: _Clocked) -> None:
        """The commit of everything processed so far succeeded: its stream time is the committed one."""
        if self._stream_time is not None:
            self._committed_stream_time = self._stream_time

    def _settle_stream_time(self: _Clocked, found: int, moved: bool) -> int:
        """The stream time to go on from, given the one the store and the record cache hold (`found`)
        and whether this transaction has moved it since the last commit (`moved`): the last commit's
        when it is known and not moved since, else the one found (which becomes the committed one
        when none is known)."""
        if self._committed_stream_time is None:
            self._committed_stream_time = found
        return found if moved else self._committed_stream_time
