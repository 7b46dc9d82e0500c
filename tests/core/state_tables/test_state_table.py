"""A snapshot read as a table: raw snapshot rows in the engine's stored format (scoped keys, window
keys, expiry headers, the stream-time record) decoded with the app's serializers, the way a
restored store would read them, and written as Parquet that pyarrow alone reads back."""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest, SnapshotStore
from dagster_stateful.core.state.decoding import RowDecoder, StoreShape
from dagster_stateful.core.state.keys import STREAM_TIME_KEY, message_prefix
from dagster_stateful.core.state.serialization import resolve_serde
from dagster_stateful.core.state.stream_time import encode_stream_time
from dagster_stateful.core.state.ttl import with_expiry
from dagster_stateful.core.state.window_state import window_key
from dagster_stateful.core.state_tables.encoding import encode_state_table
from dagster_stateful.core.state_tables.table import (
    read_snapshot_table,
    snapshot_table,
    table_written,
    write_snapshot_table,
)

STR, JSON = resolve_serde("str"), resolve_serde("json")


def write_raw_snapshot(
    root: Path, store: str, rows: dict[int, dict[bytes, bytes]]
) -> tuple[SnapshotStore, SnapshotManifest]:
    """A finished snapshot holding `rows` (partition -> stored key -> stored value), laid out as Spark writes one."""
    snapshots = SnapshotStore(str(root), "app", store)
    snapshot_id = snapshots.new_snapshot_id()
    for partition, stored in rows.items():
        directory = Path(snapshots.snapshot_location(snapshot_id)) / f"partition={partition}"
        directory.mkdir(parents=True)
        keys = sorted(stored)
        table = pa.table(
            {
                "key": pa.array(keys, pa.binary()),
                "value": pa.array([stored[k] for k in keys], pa.binary()),
                "offset": pa.array(range(len(keys)), pa.int64()),
            }
        )
        pq.write_table(table, directory / "part-0.parquet")
    counts = {partition: len(stored) for partition, stored in rows.items()}
    manifest = SnapshotManifest("app", store, f"app-{store}-changelog", snapshot_id, 0.0, counts, counts)
    snapshots.write_manifest(manifest)
    return snapshots, manifest


def scoped(customer: str, state_key: str) -> bytes:
    return message_prefix(customer.encode()) + state_key.encode()


def totals_rows() -> dict[int, dict[bytes, bytes]]:
    return {
        0: {
            scoped("alice", "total"): b'{"total": 12.5, "orders": 2}',
            scoped("bob", "total"): b'{"total": 3, "orders": 1}',
        },
        1: {scoped("carol", "total"): b'{"total": 7, "orders": 4, "vip": true}'},
        2: {},
    }


def test_json_objects_become_one_column_per_field_with_their_keys_decoded(tmp_path):
    snapshots, manifest = write_raw_snapshot(tmp_path, "totals", totals_rows())

    table = snapshot_table(RowDecoder(StoreShape("totals"), STR, JSON), snapshots, manifest)

    assert table.column_names == ["partition", "key", "state_key", "total", "orders", "vip"]
    assert table.schema.field("total").type == pa.float64(), "3 and 12.5 share one column: ints widen to floats"
    assert table.to_pylist() == [  # the store's order: message keys by length, then byte by byte
        {"partition": 0, "key": "bob", "state_key": "total", "total": 3.0, "orders": 1, "vip": None},
        {"partition": 0, "key": "alice", "state_key": "total", "total": 12.5, "orders": 2, "vip": None},
        {"partition": 1, "key": "carol", "state_key": "total", "total": 7.0, "orders": 4, "vip": True},
    ]


def test_a_partitioned_tables_rows_are_its_keys_and_values_with_no_state_key(tmp_path):
    rows = {0: {b"c1": b'{"tier": "gold"}', b"c2": b'{"tier": "silver", "since": 2024}'}, 1: {b"c3": b'"plain"'}}
    snapshots, manifest = write_raw_snapshot(tmp_path, "customers", {0: rows[0]})
    scalars, scalar_manifest = write_raw_snapshot(tmp_path / "scalars", "customers", {1: rows[1]})
    decoder = RowDecoder(StoreShape("customers", table=True), STR, JSON)

    table = snapshot_table(decoder, snapshots, manifest)

    assert table.to_pylist() == [
        {"partition": 0, "key": "c1", "tier": "gold", "since": None},
        {"partition": 0, "key": "c2", "tier": "silver", "since": 2024},
    ]
    assert snapshot_table(decoder, scalars, scalar_manifest).to_pylist() == [
        {"partition": 1, "key": "c3", "value": "plain"}
    ]


def test_the_written_table_is_plain_parquet_that_reads_back_the_same(tmp_path):
    snapshots, manifest = write_raw_snapshot(tmp_path, "totals", totals_rows())
    decoder = RowDecoder(StoreShape("totals"), STR, JSON)
    assert not table_written(snapshots, manifest.snapshot_id)

    written = write_snapshot_table(decoder, snapshots, manifest)

    assert table_written(snapshots, manifest.snapshot_id)
    location = Path(snapshots.table_location(manifest.snapshot_id))
    by_pyarrow = pq.read_table(sorted(location.glob("*.parquet")))
    assert by_pyarrow.to_pylist() == written.to_pylist() and written.num_rows == 3
    assert read_snapshot_table(decoder, snapshots, manifest).to_pylist() == written.to_pylist()


def test_a_field_named_like_a_column_is_prefixed_and_scalars_share_a_value_column(tmp_path):
    named = {0: {scoped("a", "s"): b'{"key": "k", "partition": 9, "n": 1}'}}
    scalars = {0: {scoped("a", "count"): b"4", scoped("b", "count"): b"5"}}
    decoder = RowDecoder(StoreShape("s"), STR, JSON)

    assert snapshot_table(decoder, *write_raw_snapshot(tmp_path / "1", "s", named)).to_pylist() == [
        {"partition": 0, "key": "a", "state_key": "s", "value_key": "k", "value_partition": 9, "n": 1}
    ]
    assert snapshot_table(decoder, *write_raw_snapshot(tmp_path / "2", "s", scalars)).to_pylist() == [
        {"partition": 0, "key": "a", "state_key": "count", "value": 4},
        {"partition": 0, "key": "b", "state_key": "count", "value": 5},
    ]


@pytest.mark.parametrize(
    ("values", "why"),
    [
        ({0: [b'{"n": 1}'], 1: [b'{"n": "one"}']}, "a field holds numbers in one partition and text in another"),
        ({0: [b'{"n": 1}', b'{"n": "one"}']}, "a field holds numbers and text in one partition"),
        ({0: [b'{"n": 1}'], 1: [b"7"]}, "objects in one partition, numbers in another"),
    ],
)
def test_values_no_one_type_holds_are_kept_as_their_json_text(tmp_path, values, why):
    rows = {p: {scoped(f"k{p}-{i}", "s"): v for i, v in enumerate(vs)} for p, vs in values.items()}

    table = snapshot_table(RowDecoder(StoreShape("s"), STR, JSON), *write_raw_snapshot(tmp_path, "s", rows))

    assert table.column_names == ["partition", "key", "state_key", "value"], why
    texts = [orjson.loads(text) for text in table.column("value").to_pylist()]
    assert texts == [orjson.loads(v) for vs in values.values() for v in vs], why


def test_an_expiring_store_shows_expiries_and_leaves_out_what_stream_time_expired(tmp_path):
    rows = {
        0: {
            scoped("a", "seen"): with_expiry(5_000, b"true"),
            scoped("b", "seen"): with_expiry(1_000, b"true"),  # expired: stream time is 2000
            scoped("c", "seen"): b"true",  # stored before the store had a TTL: no expiry yet
            STREAM_TIME_KEY: encode_stream_time(2_000),
        }
    }

    table = snapshot_table(
        RowDecoder(StoreShape("seen", ttl=600), STR, JSON), *write_raw_snapshot(tmp_path, "seen", rows)
    )

    assert table.to_pylist() == [
        {"partition": 0, "key": "a", "state_key": "seen", "expires_at": 5_000, "value": True},
        {"partition": 0, "key": "c", "state_key": "seen", "expires_at": None, "value": True},
    ]


def test_a_window_store_shows_each_window_and_leaves_out_those_past_retention(tmp_path):
    minute = 60_000
    rows = {
        1: {
            window_key(0, message_prefix(b"a")): b'{"count": 3}',  # past retention: stream time 4.5 min, retention 2
            window_key(3 * minute, message_prefix(b"a")): b'{"count": 1}',
            window_key(4 * minute, message_prefix(b"b")): b'{"count": 2}',
            STREAM_TIME_KEY: str(9 * minute // 2).encode(),
        }
    }
    shape = StoreShape("per_minute", window_size=minute, window_retention=2 * minute)

    table = snapshot_table(RowDecoder(shape, STR, JSON), *write_raw_snapshot(tmp_path, "per_minute", rows))

    assert table.to_pylist() == [
        {"partition": 1, "key": "a", "window_start": 3 * minute, "window_end": 4 * minute, "count": 1},
        {"partition": 1, "key": "b", "window_start": 4 * minute, "window_end": 5 * minute, "count": 2},
    ]


def test_an_empty_snapshot_is_an_empty_table_with_the_stores_columns(tmp_path):
    table = snapshot_table(RowDecoder(StoreShape("s"), STR, JSON), *write_raw_snapshot(tmp_path, "s", {0: {}, 1: {}}))

    assert table.num_rows == 0 and table.column_names[:3] == ["partition", "key", "state_key"]


@pytest.mark.parametrize("layout", ["fields", "json"])
def test_a_decoded_table_encodes_back_to_the_very_rows_it_was_read_from(tmp_path, layout):
    rows = {
        0: {
            scoped("alice", "total"): with_expiry(9_000, b'{"total":12.5,"orders":2,"key":"k"}'),
            scoped("bob", "total"): with_expiry(8_000, b'{"total":3.0,"orders":1,"key":"j"}'),
            STREAM_TIME_KEY: encode_stream_time(2_000),
        },
        1: {scoped("carol", "total"): with_expiry(7_000, b'{"total":7.0,"orders":4,"key":"i"}')},
    }
    if layout == "json":  # a field holding text in one row and a number in another: values kept as JSON text
        rows[1][scoped("dave", "total")] = with_expiry(6_000, b'{"total":"seven","orders":0,"key":"h"}')
    decoder = RowDecoder(StoreShape("totals", ttl=600), STR, JSON)
    table = snapshot_table(decoder, *write_raw_snapshot(tmp_path, "totals", rows))

    encoded = encode_state_table(table, decoder, 2, None, "the table", json_text=layout == "json")

    assert (table.schema.metadata or {})[b"dagster_stateful.value_layout"] == layout.encode()
    expected = {p: sorted((k, v) for k, v in stored.items() if k != STREAM_TIME_KEY) for p, stored in rows.items()}
    assert dict(encoded.rows) == expected
