"""Damaged and unopenable state (real RocksDB): only real corruption is moved aside, and a damaged
block met by a read is a store failure naming the partition, which the partition can quarantine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.state_damage import CONFIG, KEYS, committed_store, damage_data_block

from dagster_stateful.core import AppConfig
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.rocksdb import PartitionDatabase
from dagster_stateful.errors import StateLockedError, StoreCorruptedError

REPO = Path(__file__).resolve().parents[3]
REFUSED = 3

OPEN_WITH_FEW_FILES = f"""
import os
import resource
import sys
from pathlib import Path

from dagster_stateful.core import AppConfig
from dagster_stateful.core import AppConfig
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.rocksdb import PartitionDatabase
from dagster_stateful.errors import StateStoreError

part = StateDirectory(Path(sys.argv[1]), AppConfig(name="app", source="orders", stores=("totals",))).partition(
    "totals", 0
)
lowest_free = os.open(os.devnull, os.O_RDONLY)
os.close(lowest_free)
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free + 2, hard))  # the lock file and one more: too few for RocksDB
try:
    part.open()
except StateStoreError as error:
    print(f"{{type(error).__name__}}: {{error}}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    part.open(lock_timeout=0)  # the failed open let go of the lock
    print("REOPENED", sum(1 for _ in part.items()))
    part.close()
    sys.exit({REFUSED})
print("OPENED")
"""


def test_a_failure_to_open_that_is_not_corruption_raises_and_moves_nothing(tmp_path):
    state = committed_store(tmp_path)
    path = state.partition_path("totals", 0)
    tables = sorted(path.glob("*.sst"))

    opened = subprocess.run(
        [sys.executable, "-c", OPEN_WITH_FEW_FILES, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )

    assert opened.returncode == REFUSED, opened.stdout + opened.stderr
    first_line, reopened = opened.stdout.splitlines()[:2]
    assert first_line.startswith("StateStoreError: "), "not StoreCorruptedError: this is no corruption"
    assert str(path) in first_line and "Too many open files" in first_line and "ulimit" in first_line, first_line
    assert reopened == f"REOPENED {len(KEYS)}"
    assert state.corrupt_copies("totals", 0) == [], "nothing was moved aside"
    assert tables and all(table.is_file() for table in tables), "the data files are where they were"
    part = state.partition("totals", 0)
    part.open()
    try:
        assert not part.recovered_from_corruption and part.changelog_offset == len(KEYS)
        assert sum(1 for _ in part.items()) == len(KEYS)
    finally:
        part.close()


def garbage_current(path: Path) -> None:
    (path / "CURRENT").write_text("garbage-manifest\n")


def current_names_a_missing_manifest(path: Path) -> None:
    (path / (path / "CURRENT").read_text().strip()).unlink()


def garbled_manifest(path: Path) -> None:
    manifest = path / (path / "CURRENT").read_text().strip()
    with manifest.open("r+b") as file:
        file.seek(manifest.stat().st_size // 2)
        file.write(b"\xff" * 16)


@pytest.mark.parametrize("damage", [garbage_current, current_names_a_missing_manifest, garbled_manifest])
def test_a_damaged_current_or_manifest_is_still_moved_aside(tmp_path, damage):
    state = committed_store(tmp_path)
    damage(state.partition_path("totals", 0))

    part = state.partition("totals", 0)
    part.open()
    try:
        assert part.recovered_from_corruption and not part.has_local_state
        assert list(part.items()) == []
    finally:
        part.close()
    assert len(state.corrupt_copies("totals", 0)) == 1


def test_a_damaged_block_read_raises_store_corrupted_naming_the_partition(tmp_path):
    state = committed_store(tmp_path)
    table = damage_data_block(state.partition_path("totals", 0))
    part = state.partition("totals", 0)
    part.open()  # opening reads no data block: the damage shows on the first read that meets it
    try:
        errors = []
        for key in KEYS:
            try:
                part.get(key)
            except Exception as error:  # noqa: BLE001 - collected to check every one
                errors.append(error)

        assert errors, f"no read met the damaged block of {table}"
        assert all(isinstance(error, StoreCorruptedError) for error in errors), {type(e).__name__ for e in errors}
        first = errors[0]
        assert isinstance(first, StoreCorruptedError)
        assert (first.path, first.store, first.partition) == (str(part.path), "totals", 0)
        assert "Corruption" in str(first) and str(part.path) in str(first) and "restore" in str(first), str(first)
    finally:
        part.close()


def test_a_partition_quarantines_itself_and_starts_empty_and_locked(tmp_path):
    state = committed_store(tmp_path)
    damage_data_block(state.partition_path("totals", 0))
    part = state.partition("totals", 0)
    part.open()
    try:
        with pytest.raises(StoreCorruptedError) as raised:
            for key in KEYS:
                part.get(key)

        aside = part.quarantine(raised.value)

        assert aside in state.corrupt_copies("totals", 0) and any(aside.glob("*.sst")), "the damaged copy is kept"
        assert part.recovered_from_corruption and not part.has_local_state and part.source_offset is None
        assert list(part.items()) == [] and part.get(KEYS[0]) is None
        part.commit([(b"restored", b"1")], changelog_offset=1, source_offset=1)
        with pytest.raises(StateLockedError):
            StateDirectory(tmp_path, CONFIG).partition("totals", 0).open(lock_timeout=0)
    finally:
        part.close()
    reopened = state.partition("totals", 0)
    reopened.open()
    try:
        assert list(reopened.items()) == [(b"restored", b"1")] and reopened.changelog_offset == 1
    finally:
        reopened.close()


def test_iterating_over_a_damaged_block_raises_instead_of_ending_early(tmp_path):
    state = committed_store(tmp_path)
    damage_data_block(state.partition_path("totals", 0))
    part = state.partition("totals", 0)
    part.open()
    try:
        returned = []
        with pytest.raises(StoreCorruptedError) as raised:
            for key, _ in part.items():
                returned.append(key)

        assert len(returned) < len(KEYS), "the iteration returned every key although a block is damaged"
        assert raised.value.path == str(part.path) and "Corruption" in str(raised.value), str(raised.value)
    finally:
        part.close()
    intact = committed_store(tmp_path / "intact").partition("totals", 0)
    intact.open()
    try:
        assert [key for key, _ in intact.items()] == sorted(KEYS)
    finally:
        intact.close()


class DamageFoundOnClose(PartitionDatabase):
    """RocksDB that reports, as it closes, the corruption a background compaction met."""

    def close(self) -> None:
        super().close()
        raise StoreCorruptedError("closing: Corruption: block checksum mismatch", str(self.path), "totals", 0)


def test_a_copy_found_damaged_while_closing_is_moved_aside_and_the_next_open_starts_empty(tmp_path):
    state = committed_store(tmp_path)
    config = AppConfig(name="app", source="orders", stores=("totals",), store_backends={"totals": DamageFoundOnClose})
    part = StateDirectory(tmp_path, config).partition("totals", 0)

    part.open()
    part.close()

    assert len(state.corrupt_copies("totals", 0)) == 1, "the damaged copy is kept aside"
    reopened = state.partition("totals", 0)
    reopened.open(lock_timeout=0)  # closing let go of the lock
    try:
        assert not reopened.has_local_state and list(reopened.items()) == []
    finally:
        reopened.close()
