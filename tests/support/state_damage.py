"""Helpers for tests of damaged local state: a committed store partition whose SST data block is broken."""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from dagster_stateful.core import AppConfig
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.keys import message_prefix

CONFIG = AppConfig(name="app", source="orders", stores=("totals",))
MESSAGE_KEY = b"customer"
STATE_KEYS = [f"key-{i:05d}" for i in range(2000)]
KEYS = [message_prefix(MESSAGE_KEY) + state_key.encode() for state_key in STATE_KEYS]
"""The stored keys: STATE_KEYS of message key MESSAGE_KEY."""


def committed_store(root: Path) -> StateDirectory:
    """Partition 0 of store 'totals' under `root`, committed with KEYS (random JSON strings) and
    flushed to SST files, then closed."""
    state = StateDirectory(root, CONFIG)
    part = state.partition("totals", 0)
    part.open()
    try:
        values = (orjson.dumps(os.urandom(50).hex()) for _ in KEYS)
        part.commit(zip(KEYS, values, strict=True), changelog_offset=len(KEYS), source_offset=len(KEYS))
        part.db.flush()
    finally:
        part.close()
    return state


def damage_data_block(partition_dir: Path) -> Path:
    """Overwrite 64 bytes a quarter into the largest SST file (inside its data blocks, before the
    index at the end), as a failing disk would; returns the file."""
    table = max(partition_dir.glob("*.sst"), key=lambda path: path.stat().st_size)
    with table.open("r+b") as file:
        file.seek(table.stat().st_size // 4)
        file.write(b"\x00" * 64)
    return table
