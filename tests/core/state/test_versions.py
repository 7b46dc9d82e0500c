"""A versioned table's values, without a broker: the value as of a timestamp, tombstones ending a
version's validity, the same version applied twice changing nothing, and versions older than the
history dropped except the one still valid at its start."""

from __future__ import annotations

from dagster_stateful.core.state.versions import as_of, decode_versions, put

HISTORY = 1_000


def versions_of(*updates: tuple[int, bytes | None], newest: int | None = None) -> bytes | None:
    data: bytes | None = None
    seen = -1
    for timestamp, value in updates:
        seen = max(seen, timestamp)
        data = put(data, timestamp, value, HISTORY, seen if newest is None else newest)
    return data


def test_a_lookup_finds_the_version_valid_at_its_timestamp_whatever_order_versions_came_in():
    in_order = versions_of((100, b"a"), (200, b"b"), (300, b"c"))
    shuffled = versions_of((300, b"c"), (100, b"a"), (200, b"b"))

    assert in_order == shuffled
    assert [as_of(in_order, t, HISTORY, 300) for t in (99, 100, 199, 200, 250, 300, 10_000)] == [
        None,
        b"a",
        b"a",
        b"b",
        b"b",
        b"c",
        b"c",
    ]


def test_a_tombstone_ends_a_version_and_applying_a_version_again_changes_nothing():
    data = versions_of((100, b"a"), (200, None), (300, b"c"))

    assert [as_of(data, t, HISTORY, 300) for t in (150, 250, 300)] == [b"a", None, b"c"]
    assert put(data, 200, None, HISTORY, 300) == data
    assert put(data, 200, b"b", HISTORY, 300) != data, "a version with a held timestamp replaces it"
    assert versions_of((100, None)) is None, "nothing but a tombstone: the key holds nothing"


def test_versions_older_than_the_history_go_but_the_one_valid_at_its_start_stays():
    data = versions_of((100, b"a"), (500, b"b"), (900, b"c"), (2_000, b"d"))  # history starts at 1000

    assert [timestamp for timestamp, _ in decode_versions(data)] == [900, 2_000]
    assert as_of(data, 1_500, HISTORY, 2_000) == b"c", "the value at the start of the history is kept"
    assert as_of(data, 950, HISTORY, 2_000) is None, "a lookup older than the history finds nothing"
