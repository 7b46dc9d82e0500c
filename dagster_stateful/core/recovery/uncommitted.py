"""Which changelog records of uncommitted messages a restore applies: the at-least-once rule.

Owns `UncommittedFilter`. A changelog record carries the source offset of the message that
wrote it, or says by carrying no header where it lies that its commit never completed (see
`changelog_format`); a record whose offset is at or past the group's committed source offset
belongs to a message that was not committed (a crash between delivering
the changelog and committing the source, or a commit still in flight) and that will be processed
again. Skipping such a record is exact whenever the key's committed value is known, and that is
the rule: skip it when
- nothing was ever committed (processing starts from the source's beginning and rebuilds all);
- the store being restored into stands at the committed source offset (`at_committed`): its
  state is the committed one, and what the range holds after it is uncommitted work;
- the restore has applied a committed record of the key already; or
- no offset is missing in the range read before the record: compaction removed nothing there,
  so every committed record of the key (after the store's own state) has been applied.
Otherwise compaction may have removed the key's committed record (the changelog keeps only the
newest record per key), and skipping would drop the key's committed state; at-least-once never
loses (it may double), so such a record is applied, with any newer uncommitted record of the key,
and counted (`applied_uncommitted`: the only way a restore can double).

Stream time (`keys.STREAM_TIME_KEY`) is never taken from a record of an uncommitted message,
whatever the rest: messages processed again must be judged by the stream time of the last commit,
which the commit's metadata carries (see `processing.commit_metadata`).

The filter also remembers the first uncommitted record's offset: a restore never records a
changelog position past it, so records of a commit that completes later are read again. And it
remembers the keys whose records it skipped inside a block (`changelog_format`): a block counts
as committed once the group's offset passes its first offset, so the worker that takes the
partition rewrites those keys' committed values in its first commit (`rewrite`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import compress, repeat
from operator import is_

from dagster_stateful.core.state.keys import STREAM_TIME_KEY

OFFSET_BYTES = 8


def encode_processed_offset(offset: int) -> bytes:
    return offset.to_bytes(OFFSET_BYTES, "big", signed=True)


def decode_processed_offset(encoded: bytes) -> int:
    return int.from_bytes(encoded, "big", signed=True)


class UncommittedFilter:
    """Decides, record by record in changelog order, whether a restore applies a record.

    committed_offset: the group's committed source offset (None: nothing was ever committed).
    restored: for a restore into an empty store, tells whether the store (or the batch being
        written) already holds a key: a key there came from a committed record of this restore.
        None for a restore on top of existing state: the filter then tracks the keys itself.
    start: the first changelog offset the range read covers: an offset missing from there on is a
        record compaction removed (a full restore's range starts at 0).
    at_committed: the store's own state stands at `committed_offset` (a restore on top of it).
    """

    def __init__(
        self,
        committed_offset: int | None,
        restored: Callable[[bytes], bool] | None,
        start: int = 0,
        at_committed: bool = False,
    ) -> None:
        self.committed_offset = committed_offset
        self.committed_bytes = encode_processed_offset(committed_offset if committed_offset is not None else 0)
        self.at_committed = at_committed and committed_offset is not None
        self._restored = restored
        self._seen_committed: set[bytes] = set()
        self._deleted: set[bytes] = set()
        self._uncommitted_keys: set[bytes] = set()
        self._known: set[bytes] = set()
        """Keys an uncommitted record of was skipped because their committed state was known."""
        self._next_offset = start
        self.gap_at: int | None = None
        """The offset of the first record read after a missing offset (None: none missing so far)."""
        self.first_uncommitted: int | None = None
        self.processed_up_to: bytes | None = None
        """The highest processed offset (8 bytes) among the uncommitted records seen (None: none)."""
        self.bare_uncommitted_read = False
        """Whether an uncommitted record without headers was seen (its processed offset is not known)."""
        self.skipped = 0
        self.applied_uncommitted = 0
        self.rewrite: set[bytes] = set()
        """Keys whose records of an uncommitted block were skipped: their committed value must be written again."""

    @property
    def remembers_committed_keys(self) -> bool:
        """Whether `admit_committed` must see every committed record (restores on top of existing
        state), not only tombstones and keys restored from uncommitted records."""
        return self._restored is None or bool(self._uncommitted_keys)

    def note_batch(self, first: int, last: int, count: int, offsets: Callable[[], Iterable[int]]) -> None:
        """The changelog offsets of the next batch read, in order: `first`, `last`, how many, and all of
        them (asked for only when the batch is not contiguous from where the last one ended)."""
        if self.gap_at is not None:
            return
        if first == self._next_offset and last - first + 1 == count:
            self._next_offset = last + 1
            return
        expected = self._next_offset
        for offset in offsets():
            if offset != expected:
                self.gap_at = offset
                return
            expected = offset + 1

    def is_uncommitted(self, processed: bytes | None) -> bool:
        """Whether a record whose processed-offset header is `processed` (8 bytes) is uncommitted.

        Big-endian signed offsets of non-negative values order like their bytes.
        """
        return processed is not None and processed >= self.committed_bytes

    def admit_committed(self, key: bytes, value: bytes | None) -> None:
        """A committed record is always applied; remember that the key's committed state is known."""
        if self._restored is None:
            self._seen_committed.add(key)
        elif value is None:
            self._deleted.add(key)
        if self._uncommitted_keys:
            self._uncommitted_keys.discard(key)

    def admit_committed_batch(self, keys: list[bytes], values: list[bytes | None]) -> None:
        """`admit_committed` of a batch of committed records (and of nothing else), in bulk."""
        if self._restored is None:
            self._seen_committed.update(keys)
        elif None in values:
            self._deleted.update(compress(keys, map(is_, values, repeat(None))))
        if self._uncommitted_keys:
            self._uncommitted_keys.difference_update(keys)

    def admit_uncommitted(
        self, key: bytes, offset: int, processed: bytes | None = None, in_block: bool = False
    ) -> bool:
        """Whether to apply an uncommitted record of `key` at changelog `offset`, written by processing
        the source message at `processed` (8 bytes, when known: a record without headers does not say;
        in a block, the highest offset its commit covers)."""
        admitted = self._admit_uncommitted(key, offset, processed)
        if in_block and not admitted:
            self.rewrite.add(key)
        return admitted

    def _admit_uncommitted(self, key: bytes, offset: int, processed: bytes | None) -> bool:
        if processed is None:
            self.bare_uncommitted_read = True
        elif self.processed_up_to is None or processed > self.processed_up_to:
            self.processed_up_to = processed
        if self.first_uncommitted is None:
            self.first_uncommitted = offset
        if key in self._uncommitted_keys:
            return True  # newer than the uncommitted record already applied
        if self.committed_offset is None or key == STREAM_TIME_KEY:
            self.skipped += 1
            return False
        if self._committed_known(key, offset):
            self._known.add(key)
            self.skipped += 1
            return False
        self._uncommitted_keys.add(key)
        self.applied_uncommitted += 1
        return True

    def resume_offset(self, end: int) -> int:
        """The changelog position a restore that read up to `end` may record."""
        return end if self.first_uncommitted is None else min(end, self.first_uncommitted)

    def _committed_known(self, key: bytes, offset: int) -> bool:
        if self.at_committed or self.gap_at is None or offset < self.gap_at or key in self._known:
            return True
        if self._restored is None:
            return key in self._seen_committed
        return key in self._deleted or self._restored(key)
