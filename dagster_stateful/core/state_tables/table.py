"""A snapshot of a store as a typed table: its raw rows decoded with the app's serializers.

Owns `snapshot_table` (a snapshot decoded into one Arrow table), `write_snapshot_table` (that
table written as Parquet beside the raw files, `SnapshotStore.table_location`, one file per Kafka
partition and `_SUCCESS` last, for any engine to read without this package) and
`read_snapshot_table` (the written table, or the snapshot decoded when none was written).

Columns: `partition`, `key` (the message key, decoded), then `state_key` (and `expires_at` for an
expiring store) or, for a window store, `window_start` and `window_end` (ms); a partitioned
table's store has neither (its rows are its keys and their values). A value that is a
JSON object gives one column per field (named `value_<field>` where a field's name is taken);
other values share a `value` column. Types are Arrow's inference over every row, ints widened to
floats where both occur; when no one type fits (a field holding both text and numbers), every
value is kept as its JSON text in `value`. Rows are those a store restored from the snapshot
would read: expired entries and windows past their retention (by the partition's stream time,
which is not a row) are left out.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from dagster_stateful.core.recovery.snapshot_format import TABLE_DIR, SnapshotManifest, SnapshotStore
from dagster_stateful.core.state.decoding import RowDecoder, StateEntry, WindowEntry
from dagster_stateful.core.state.keys import STREAM_TIME_KEY, is_reserved

__all__ = ["read_snapshot_table", "snapshot_table", "table_layout", "table_written", "write_snapshot_table"]

log = logging.getLogger(__name__)

DONE_MARKER = "_SUCCESS"
VALUE_LAYOUT = b"dagster_stateful.value_layout"
"""Schema metadata: how values became columns, "fields", "value" or "json"."""
_START_BYTES = 8


class _NoCommonType(Exception):
    """Values (or keys) that no single Arrow type holds."""


def snapshot_table(decoder: RowDecoder, snapshots: SnapshotStore, manifest: SnapshotManifest) -> pa.Table:
    """The snapshot's rows, decoded, as one table (partitions in order, each in its key order)."""
    partitions = sorted(manifest.key_counts)
    try:
        return _unified([_partition_table(decoder, snapshots, manifest, p, as_json=False) for p in partitions])
    except _NoCommonType as reason:
        log.info("Snapshot %s of %s: values kept as JSON text (%s)", manifest.snapshot_id, snapshots.store, reason)
        return _unified([_partition_table(decoder, snapshots, manifest, p, as_json=True) for p in partitions])


def write_snapshot_table(decoder: RowDecoder, snapshots: SnapshotStore, manifest: SnapshotManifest) -> pa.Table:
    """Decode the snapshot and write it beside the raw files; returns the table written."""
    table = snapshot_table(decoder, snapshots, manifest)
    fs, directory = snapshots.filesystem_path(manifest.snapshot_id, TABLE_DIR)
    fs.create_dir(directory, recursive=True)
    for partition in sorted(manifest.key_counts):
        rows = table.filter(pc.equal(table["partition"], partition))
        pq.write_table(rows, f"{directory}/part-{partition:05d}.parquet", filesystem=fs)
    with fs.open_output_stream(f"{directory}/{DONE_MARKER}") as stream:
        stream.write(b"")
    log.info(
        "Snapshot %s of %s: decoded table of %d rows written to %s",
        manifest.snapshot_id,
        snapshots.store,
        table.num_rows,
        snapshots.table_location(manifest.snapshot_id),
    )
    return table


def table_written(snapshots: SnapshotStore, snapshot_id: str) -> bool:
    fs, marker = snapshots.filesystem_path(snapshot_id, TABLE_DIR, DONE_MARKER)
    return fs.get_file_info(marker).type == pafs.FileType.File


def table_layout(snapshots: SnapshotStore, snapshot_id: str) -> str:
    """How the written table of a snapshot lays values out: "fields", "value" or "json" ("" if unwritten)."""
    fs, directory = snapshots.filesystem_path(snapshot_id, TABLE_DIR)
    files = [info.path for info in fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))]
    parquet = sorted(path for path in files if path.endswith(".parquet"))
    if not parquet:
        return ""
    metadata = pq.read_schema(parquet[0], filesystem=fs).metadata or {}
    return metadata.get(VALUE_LAYOUT, b"").decode()


def read_snapshot_table(decoder: RowDecoder, snapshots: SnapshotStore, manifest: SnapshotManifest) -> pa.Table:
    """The snapshot's decoded table: read where it was written, else decoded now."""
    if not table_written(snapshots, manifest.snapshot_id):
        return snapshot_table(decoder, snapshots, manifest)
    fs, directory = snapshots.filesystem_path(manifest.snapshot_id, TABLE_DIR)
    selector = pafs.FileSelector(directory)
    files = sorted(info.path for info in fs.get_file_info(selector) if info.base_name.endswith(".parquet"))
    return pa.concat_tables(pq.read_table(path, filesystem=fs) for path in files)


def _partition_table(
    decoder: RowDecoder, snapshots: SnapshotStore, manifest: SnapshotManifest, partition: int, as_json: bool
) -> pa.Table:
    log.info(
        "Decoding snapshot %s of %s: partition %d (%d keys)",
        manifest.snapshot_id,
        snapshots.store,
        partition,
        manifest.key_counts.get(partition, 0),
    )
    stream_time = decoder.stream_time(snapshots.read_value(manifest.snapshot_id, partition, STREAM_TIME_KEY))
    batches = [
        _columns(decoder, _entries(decoder, partition, keys, values, stream_time), as_json)
        for keys, values in snapshots.read_partition(manifest.snapshot_id, partition)
    ]
    if not batches:
        return _columns(decoder, [], as_json)
    try:
        return pa.concat_tables(batches, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
        raise _NoCommonType(f"partition {partition}: {error}") from None


def _entries(
    decoder: RowDecoder, partition: int, keys: list[bytes], values: list[bytes], stream_time: int
) -> list[StateEntry] | list[WindowEntry]:
    if decoder.shape.is_window_store:
        windows = (
            decoder.live_window(partition, key, data, stream_time)
            for key, data in zip(keys, values, strict=True)
            if not is_reserved(key)
        )
        return [window for window in windows if window is not None]
    entries = (
        decoder.entry(partition, key, data, stream_time)
        for key, data in zip(keys, values, strict=True)
        if not is_reserved(key)
    )
    return [entry for entry in entries if entry is not None]


def _columns(decoder: RowDecoder, entries: list[StateEntry] | list[WindowEntry], as_json: bool) -> pa.Table:
    columns: dict[str, pa.Array] = {
        "partition": pa.array([entry.partition for entry in entries], pa.int32()),
        "key": _inferred([entry.message_key for entry in entries], "keys"),
    }
    if decoder.shape.is_window_store:
        windows = [entry for entry in entries if isinstance(entry, WindowEntry)]
        columns["window_start"] = pa.array([window.start for window in windows], pa.int64())
        columns["window_end"] = pa.array([window.end for window in windows], pa.int64())
    elif not decoder.shape.table:
        states = [entry for entry in entries if isinstance(entry, StateEntry)]
        columns["state_key"] = pa.array([state.state_key for state in states], pa.string())
        if decoder.shape.ttl is not None:
            columns["expires_at"] = pa.array([state.expires_at for state in states], pa.int64())
    values = [entry.value for entry in entries]
    layout, value_columns = ("json", {"value": _json_texts(values)}) if as_json else _value_columns(values, columns)
    table = pa.table({**columns, **value_columns})
    return table.replace_schema_metadata({VALUE_LAYOUT: layout.encode()})


def _value_columns(values: list[Any], taken: Iterable[str]) -> tuple[str, dict[str, pa.Array]]:
    inferred = _inferred(values, "values")
    if not values or not pa.types.is_struct(inferred.type) or inferred.type.num_fields == 0:
        return "value", {"value": inferred}
    names = set(taken)
    fields = inferred.type
    return "fields", {
        (f"value_{field.name}" if field.name in names else field.name): child
        for field, child in zip(fields, inferred.flatten(), strict=True)
    }


def _inferred(items: list[Any], what: str) -> pa.Array:
    try:
        return pa.array(items)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as error:
        raise _NoCommonType(f"no one Arrow type holds these {what}: {error}") from None


def _json_texts(values: list[Any]) -> pa.Array:
    return pa.array([orjson.dumps(value, default=repr).decode() for value in values], pa.string())


def _unified(tables: list[pa.Table]) -> pa.Table:
    """The partitions' tables as one, with one schema: a column missing from a partition is null there."""
    filled = [table for table in tables if table.num_rows] or tables[:1]
    layouts = {(table.schema.metadata or {}).get(VALUE_LAYOUT, b"") for table in filled}
    if len(layouts) > 1:
        raise _NoCommonType(f"values are objects in some partitions and not in others ({sorted(layouts)})")
    try:
        schema = pa.unify_schemas([table.schema for table in filled], promote_options="permissive")
        return pa.concat_tables([_conformed(table, schema) for table in filled], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
        raise _NoCommonType(f"the partitions' columns differ in type: {error}") from None


def _conformed(table: pa.Table, schema: pa.Schema) -> pa.Table:
    columns = [
        table[field.name].cast(field.type) if field.name in table.column_names else pa.nulls(table.num_rows, field.type)
        for field in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)
