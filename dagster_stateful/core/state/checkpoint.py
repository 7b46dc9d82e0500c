"""The `.checkpoint` file: a JSON mirror of a store partition's offsets, next to its database.

Owns its format and its atomic publication (write a temporary file, then rename). The database
holds the authoritative offsets; this file exists so another process (a Dagster sensor, an
operator) can read a partition's progress without opening RocksDB. A store kept in memory has one
only while a worker holds its data.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

CHECKPOINT_FILE = ".checkpoint"


@dataclass(frozen=True)
class Checkpoint:
    changelog_topic: str
    partition: int
    changelog_offset: int | None
    """Next changelog offset to read: every record before it is in the local store."""
    source_topic: str
    source_offset: int | None
    """Committed source offset (the next message to process) the local state corresponds to."""
    updated_at: float
    kept_by_standby: bool = False
    """Written by a standby replica: a member of this client that takes the partition takes over a warm copy."""


def write_checkpoint(directory: Path, checkpoint: Checkpoint) -> None:
    temporary = directory / f"{CHECKPOINT_FILE}.tmp"
    temporary.write_text(json.dumps(asdict(checkpoint)))
    os.replace(temporary, directory / CHECKPOINT_FILE)


def remove_checkpoint(directory: Path) -> None:
    """No checkpoint: the partition holds no local state (an in-memory store once its worker let go)."""
    (directory / CHECKPOINT_FILE).unlink(missing_ok=True)


def read_checkpoint(directory: Path) -> Checkpoint | None:
    """The partition's checkpoint, or None when there is none (or it cannot be read)."""
    try:
        data = json.loads((directory / CHECKPOINT_FILE).read_text())
        return Checkpoint(**data)
    except (OSError, ValueError, TypeError):
        return None
