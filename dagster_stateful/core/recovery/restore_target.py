"""What a changelog replay writes into.

Owns `RestoreTarget`, the part of a store partition that `changelog.ChangelogRestore` uses: a
`StorePartition` is one, and so is `parallel_replay.SstFilesTarget`, which turns a full restore run
in another process into SST files.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from dagster_stateful.core.state.changelog_prefix import ChangelogPrefix


class RestoreTarget(Protocol):
    """Where a `ChangelogRestore` writes: a `StorePartition`, or the SST files of a full restore run
    in another process (`parallel_replay.SstFilesTarget`)."""

    store: str
    partition: int
    changelog_topic: str
    changelog_offset: int | None
    source_offset: int | None
    changelog_prefix: ChangelogPrefix | None
    keys_to_rewrite: set[bytes]

    def holds(self, key: bytes) -> bool: ...

    def write_restored(self, changes: Iterable[tuple[bytes, bytes | None]], changelog_offset: int) -> None: ...

    def ingest_restored(self, changes: Iterable[tuple[bytes, bytes | None]], changelog_offset: int) -> None: ...

    def finish_restore(self, changelog_offset: int, source_offset: int | None) -> None: ...

    def flush(self) -> None: ...
