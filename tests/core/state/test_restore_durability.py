"""A finished restore makes its data durable before the offsets that claim it (real RocksDB, real process deaths).

Restore batches are written without RocksDB's write-ahead log; a process killed while a restore
finishes must never leave a store that believes it reached a changelog offset whose records it lacks
(it would then never replay them: silent state loss).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dagster_stateful.core import AppConfig
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.partition import StorePartition

REPO = Path(__file__).resolve().parents[3]
RECORDS = 100
BATCH = 10
DIED = 17

RESTORE_AND_DIE = f"""
import os
import sys
from pathlib import Path

from dagster_stateful.core import AppConfig
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.rocksdb import PartitionDatabase

root, moment = Path(sys.argv[1]), sys.argv[2]
part = StateDirectory(root, AppConfig(name="app", source="orders", stores=("totals",))).partition("totals", 0)
part.open()
flush = PartitionDatabase.flush


def dying_flush(self):
    if moment == "after-flush":
        flush(self)
    os._exit({DIED})  # like SIGKILL: no clean close, no flush at shutdown


PartitionDatabase.flush = dying_flush
for start in range(0, {RECORDS}, {BATCH}):
    batch = [(f"key-{{i:03d}}".encode(), f"value-{{i}}".encode()) for i in range(start, start + {BATCH})]
    part.write_restored(batch, changelog_offset=start + {BATCH})  # changelog record i holds key-i
part.finish_restore({RECORDS}, source_offset=42)
os._exit(0)
"""


def partition_at(root: Path) -> StorePartition:
    return StateDirectory(root, AppConfig(name="app", source="orders", stores=("totals",))).partition("totals", 0)


def missing_below(part: StorePartition, claimed: int) -> list[int]:
    """Changelog offsets below `claimed` whose record's key the store does not hold."""
    present = {key for key, _ in part.items()}
    return [i for i in range(claimed) if f"key-{i:03d}".encode() not in present]


@pytest.mark.parametrize("moment", ["at-flush", "after-flush"])
def test_a_restore_killed_while_finishing_never_claims_data_it_lacks(tmp_path, moment):
    died = subprocess.run(
        [sys.executable, "-c", RESTORE_AND_DIE, str(tmp_path), moment],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert died.returncode == DIED, died.stdout + died.stderr

    part = partition_at(tmp_path)
    part.open()
    try:
        claimed = part.changelog_offset
        checkpoint = part.read_checkpoint()
        if claimed is not None:
            assert missing_below(part, claimed) == [], f"the store claims changelog offset {claimed} without its data"
        if moment == "after-flush":
            assert claimed == RECORDS, "flushed data keeps the position its batches reached"
        if checkpoint is not None and checkpoint.changelog_offset is not None:
            assert missing_below(part, checkpoint.changelog_offset) == [], "the checkpoint claims data it lacks"
    finally:
        part.close()
