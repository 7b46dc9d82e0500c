"""A store's state as rows Dagster shows: samples in a store asset's metadata, the query_state job's answer.

Also the rows of one key read from the freshest copy (`key_read_rows`) and where each copy is
(`copy_summary`), for the query_state job of an app with standby replicas.

Owns `state_rows` (entries or windows of a store, read through `App.read_state`, so without taking
any lock: from a running worker's partitions, a stopped one's, or the warm copies this machine
keeps) and `state_sample` (a few rows per materialized partition). Each row is a JSON object:
partition, message key, state key (or a window's start and end), value, and an expiring entry's
expiry.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any

import orjson

from dagster_stateful.core.app import App
from dagster_stateful.core.queries.key_reads import KeyRead, StateCopy
from dagster_stateful.core.state.decoding import StateEntry, WindowEntry

STATE_SAMPLE_ROWS = 5
"""Rows of state a store asset's materialization shows, per store."""


def state_rows(
    app: App,
    store: str,
    partitions: list[int] | None = None,
    message_key: str | None = None,
    state_key: str | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Up to `limit` rows of `store` (its local partitions, or `partitions`): all, or one message
    key's, or one state key of it (a window store's: the key's windows, oldest first)."""
    local = app.state.local_partitions(store)
    chosen = [partition for partition in (local if partitions is None else partitions) if partition in local]
    if not chosen:
        return []
    with app.read_state(store, chosen) as reader:
        entries: Iterator[StateEntry | WindowEntry]
        if reader.is_window_store:
            entries = reader.windows(message_key)
        else:
            entries = (
                entry for entry in reader.items(message_key) if state_key is None or entry.state_key == state_key
            )
        return [_row(entry) for entry in islice(entries, limit)]


def key_read_rows(read: KeyRead, state_key: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """The rows of a key read from the freshest copy (`App.read_key`): its entries, or one state key's."""
    entries = (
        entry
        for entry in read.entries
        if state_key is None or isinstance(entry, WindowEntry) or entry.state_key == state_key
    )
    return [_row(entry) for entry in islice(entries, limit)]


def copy_summary(copy: StateCopy) -> dict[str, Any]:
    """Where a copy of a store partition is, and how far behind its changelog, for a run's metadata."""
    member = copy.member
    return {
        "role": copy.role,
        "member": (member.group_instance_id or member.client_id) if member is not None else None,
        "state_dir": str(copy.root),
        "changelog_records_behind": copy.behind,
    }


def state_sample(app: App, store: str, partitions: list[int]) -> list[dict[str, Any]]:
    """The first rows of `store` in `partitions`, for a materialization's metadata."""
    return state_rows(app, store, partitions, limit=STATE_SAMPLE_ROWS)


def _row(entry: StateEntry | WindowEntry) -> dict[str, Any]:
    if isinstance(entry, WindowEntry):
        row: dict[str, Any] = {"partition": entry.partition, "key": _plain(entry.message_key)}
        row.update(start=entry.start, end=entry.end, value=_plain(entry.value))
        return row
    row = {"partition": entry.partition, "key": _plain(entry.message_key), "state_key": entry.state_key}
    row["value"] = _plain(entry.value)
    if entry.expires_at is not None:
        row["expires_at"] = entry.expires_at
    return row


def _plain(value: Any) -> Any:
    """`value` when JSON can show it, else its repr."""
    try:
        orjson.dumps(value)
    except TypeError:
        return repr(value)
    return value
