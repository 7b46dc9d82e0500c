"""A table given as a store's state, checked row by row before anything is written: each refusal
names the row and key and says what to do; a table that fits lands each key on its messages' partition."""

from __future__ import annotations

import pyarrow as pa
import pytest

from dagster_stateful.core.kafka.partitioner import partition_of
from dagster_stateful.core.state.decoding import RowDecoder, StoreShape
from dagster_stateful.core.state.keys import message_prefix
from dagster_stateful.core.state.serialization import resolve_serde
from dagster_stateful.core.state_tables.encoding import encode_state_table
from dagster_stateful.errors import StateTableError

TOTALS = RowDecoder(StoreShape("totals"), resolve_serde("str"), resolve_serde("json"))
WHAT = "the table bootstrapping store 'totals'"


def encode(rows: dict, decoder: RowDecoder = TOTALS, partitioner="murmur2"):
    return encode_state_table(pa.table(rows), decoder, 4, partitioner, WHAT)


def test_each_key_lands_on_the_partition_its_messages_reach_sorted_as_the_store_keeps_them():
    keys = [f"c{i}" for i in range(40)]
    encoded = encode({"key": keys, "state_key": ["total"] * 40, "value": list(range(40))})

    assert encoded.row_count == 40
    for partition, rows in encoded.rows.items():
        assert [key for key, _ in rows] == sorted(key for key, _ in rows)
        for key, _ in rows:
            customer = key[4 : -len(b"total")]
            assert partition_of(customer, 4) == partition and key == message_prefix(customer) + b"total"


@pytest.mark.parametrize(
    ("rows", "decoder", "says"),
    [
        ({"key": ["a"], "value": [1]}, TOTALS, r"lacks the columns \['state_key'\]"),
        (
            {"key": [1], "state_key": ["t"], "value": [1]},
            TOTALS,
            r"row 0 \(key 1\): the key does not fit the str serializer",
        ),
        (
            {"key": ["a"], "state_key": ["t"], "value": [b"\x00"]},
            TOTALS,
            "row 0 .*the value does not fit the json serializer",
        ),
        (
            {"key": ["a", "a"], "state_key": ["t", "t"], "value": [1, 2]},
            TOTALS,
            "row 1: key 'a' and state key 't' appear more than once",
        ),
        (
            {"key": ["a"], "state_key": ["t"], "value": [1], "partition": [(partition_of(b"a", 4) + 1) % 4]},
            TOTALS,
            r"row 0: key 'a' is in partition .* but the source's partitioner \(murmur2\) sends",
        ),
        (
            {"key": ["a"], "state_key": ["t"], "value": [1]},
            RowDecoder(StoreShape("w", window_size=1000), resolve_serde("str"), resolve_serde("json")),
            "is a window store",
        ),
    ],
)
def test_a_table_that_does_not_fit_is_refused_naming_the_row_and_what_to_do(rows, decoder, says):
    with pytest.raises(StateTableError, match=says) as refused:
        encode(rows, decoder)

    assert str(refused.value).startswith(WHAT)


def test_an_empty_key_has_no_partition_under_librdkafkas_consistent_partitioner():
    with pytest.raises(StateTableError, match="empty key"):
        encode({"key": [""], "state_key": ["t"], "value": [1]}, partitioner="consistent")
