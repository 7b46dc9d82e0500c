"""What is known of a store partition's changelog below a position: its committed prefix.

Owns `ChangelogPrefix`. Every record of the changelog partition below `end` was written by
processing a message before source offset `processed_before`; `produced` records have been sent
past `end` since, by this worker, and not yet seen acknowledged. A restore that read the changelog
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
    processed_before: int
    produced: int = 0

    @classmethod
    def read(cls, end: int, committed: int | None, uncommitted_up_to: int | None = None) -> ChangelogPrefix:
        """What a restore that read the changelog up to `end` knows, at the group's `committed` offset,
        having met records of uncommitted messages processed up to `uncommitted_up_to` (None: none)."""
        floor = committed or 0
        return cls(end, floor if uncommitted_up_to is None else max(floor, uncommitted_up_to + 1))
