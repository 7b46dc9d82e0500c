"""What is known of a store partition's changelog below a position: its committed prefix.

Owns `ChangelogPrefix`. Every record of the changelog partition below `end` was written by
processing a message before source offset `processed_before` (None: not known yet, until the
worker reads where the source ends); `produced` records have been sent past `end` since, by this
worker, and not yet seen acknowledged. A restore that read the changelog
up to `end`, on top of state whose own position the group's last commit vouched for (or of none),
establishes it (`recovery.changelog`); each at-least-once commit moves `end` over its own
acknowledged records, and drops the prefix once the changelog grew by anything else
(`processing.changelog_positions`). A commit at or past `processed_before` may then tell restores
that every record below `end` is of a committed message (`processing.commit_metadata`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ChangelogPrefix:
    end: int
    processed_before: int | None
    produced: int = 0

    @classmethod
    def read(
        cls,
        end: int,
        committed: int | None,
        uncommitted_up_to: int | None = None,
        bare_uncommitted_read: bool = False,
    ) -> ChangelogPrefix:
        """What a restore that read the changelog up to `end` knows, at the group's `committed` offset,
        having met records of uncommitted messages processed up to `uncommitted_up_to` (None: none),
        and records of uncommitted messages that do not say which (`bare_uncommitted_read`)."""
        floor = committed or 0
        if bare_uncommitted_read:
            return cls(end, None)
        processed_before = floor if uncommitted_up_to is None else max(floor, uncommitted_up_to + 1)
        return cls(end, processed_before)

    def vouches_at(self, offset: int) -> bool:
        """Whether a commit at source `offset` may record `end`: every record below it is of a message before it."""
        return self.processed_before is not None and offset >= self.processed_before

    def resolve(self, source_end: int) -> None:
        """Bound an unknown `processed_before` by where the source ends now: the uncommitted records
        read were written by processing messages that the source held already."""
        if self.processed_before is None:
            self.processed_before = source_end
