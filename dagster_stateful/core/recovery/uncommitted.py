"""Which changelog records of uncommitted messages a restore applies: the at-least-once rule.

Owns `UncommittedFilter`. Each changelog record carries the source offset of the message that
wrote it (see `changelog.source_offset_header`); a record whose offset is at or past the group's
committed source offset belongs to a message that was not committed (a crash between delivering
the changelog and committing the source, or a commit still in flight) and that will be processed
again. Skipping every such record would be exact, were it not for compaction: the changelog keeps
only the newest record per key, so the key's committed record may be gone, and skipping the
uncommitted one would then drop the key's committed state. At-least-once never loses (it may
double), so the rule is: skip an uncommitted record only when this restore has already applied a
committed record of that key; otherwise apply it (and any newer uncommitted record of the key).

When nothing was ever committed (no committed offset), every record is of an uncommitted message
and all are skipped: processing starts from the source's beginning and rebuilds the state exactly.

The filter also remembers the first uncommitted record's offset: a restore never records a
changelog position past it, so records of a commit that completes later are read again.
"""

from __future__ import annotations

from collections.abc import Callable

OFFSET_BYTES = 8


def encode_processed_offset(offset: int) -> bytes:
    return offset.to_bytes(OFFSET_BYTES, "big", signed=True)


class UncommittedFilter:
    """Decides, record by record in changelog order, whether a restore applies a record.

    committed_offset: the group's committed source offset (None: nothing was ever committed).
    restored: for a restore into an empty store, tells whether the store (or the batch being
        written) already holds a key: a key there came from a committed record of this restore.
        None for a restore on top of existing state: the filter then tracks the keys itself.
    """

    def __init__(self, committed_offset: int | None, restored: Callable[[bytes], bool] | None) -> None:
        self.committed_offset = committed_offset
        self.committed_bytes = encode_processed_offset(committed_offset if committed_offset is not None else 0)
        self._restored = restored
        self._seen_committed: set[bytes] = set()
        self._deleted: set[bytes] = set()
        self._uncommitted_keys: set[bytes] = set()
        self.first_uncommitted: int | None = None
        self.skipped = 0
        self.applied_uncommitted = 0

    @property
    def remembers_committed_keys(self) -> bool:
        """Whether `admit_committed` must see every committed record (restores on top of existing
        state), not only tombstones and keys restored from uncommitted records."""
        return self._restored is None or bool(self._uncommitted_keys)

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

    def admit_uncommitted(self, key: bytes, offset: int) -> bool:
        """Whether to apply an uncommitted record of `key` at changelog `offset`."""
        if self.first_uncommitted is None:
            self.first_uncommitted = offset
        if self.committed_offset is None:
            self.skipped += 1
            return False
        if key in self._uncommitted_keys:
            return True
        if self._committed_seen(key):
            self.skipped += 1
            return False
        self._uncommitted_keys.add(key)
        self.applied_uncommitted += 1
        return True

    def resume_offset(self, end: int) -> int:
        """The changelog position a restore that read up to `end` may record."""
        return end if self.first_uncommitted is None else min(end, self.first_uncommitted)

    def _committed_seen(self, key: bytes) -> bool:
        if self._restored is None:
            return key in self._seen_committed
        return key in self._deleted or self._restored(key)
