"""State scoping, the write cache and serializers: pure logic on a real local RocksDB, no Kafka."""

from __future__ import annotations

import tracemalloc

import orjson
import pytest

from dagster_stateful.core import AppConfig, BytesSerde, IntSerde, JsonSerde, StrSerde
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.keys import message_prefix, split_store_key
from dagster_stateful.core.state.serialization import LiveSerializer, resolve_serde
from dagster_stateful.core.state.transaction import PartitionTransaction
from dagster_stateful.errors import ConfigurationError, StateSerializationError


@pytest.fixture
def transaction(tmp_path):
    store = StateDirectory(tmp_path, AppConfig(name="app", source="orders", stores=("totals",))).partition("totals", 0)
    store.open()
    yield PartitionTransaction(0, {"totals": store}, JsonSerde(), committed_offset=None)
    store.close()


def test_a_message_key_never_sees_another_keys_state(transaction):
    state = transaction.states["totals"]
    transaction.begin_message(b"A", 0)
    state.set("total", 10)
    transaction.accept_message(0)
    transaction.begin_message(b"B", 1)
    assert state.get("total") is None and not state.exists("total")
    state.set("total", 1)
    transaction.accept_message(1)
    transaction.begin_message(b"A", 2)
    assert state.get("total") == 10


def test_prefixes_cannot_collide():
    # Without a length prefix, key "ab" + state "c" and key "a" + state "bc" would be the same bytes.
    assert message_prefix(b"ab") + b"c" != message_prefix(b"a") + b"bc"
    assert split_store_key(message_prefix(b"ab") + b"c") == (b"ab", b"c")


def test_repeated_writes_cost_one_change_and_failed_messages_leave_no_trace(transaction):
    state = transaction.states["totals"]
    for offset in range(5):
        transaction.begin_message(b"A", offset)
        state.set("total", state.get("total", 0) + 1)
        transaction.accept_message(offset)
    transaction.begin_message(b"A", 5)
    state.set("total", 999)
    state.delete("other")
    transaction.discard_message()

    changes = list(transaction.changes("totals"))
    assert changes == [(message_prefix(b"A") + b"total", b"5", 4)], "last value wins, tagged with its offset"
    assert transaction.next_offset == 5


def test_deletes_are_tombstones_and_commits_reach_rocksdb(transaction):
    state = transaction.states["totals"]
    transaction.begin_message(b"A", 0)
    state.set("x", {"n": 1})
    state.set("y", [1, 2])
    transaction.accept_message(0)
    store = transaction.stores["totals"]
    store.commit(((k, v) for k, v, _ in transaction.changes("totals")), changelog_offset=2, source_offset=1)
    transaction.committed()
    transaction.begin_message(b"A", 1)
    state.delete("x")
    transaction.accept_message(1)

    assert list(transaction.changes("totals")) == [(message_prefix(b"A") + b"x", None, 1)]
    assert state.get("x", "gone") == "gone" and state.get("y") == [1, 2]
    assert store.read_checkpoint().changelog_offset == 2 and store.read_checkpoint().source_offset == 1


def test_none_is_not_a_state_value(transaction):
    transaction.begin_message(b"A", 0)
    with pytest.raises(ValueError, match="delete"):
        transaction.states["totals"].set("x", None)


@pytest.mark.parametrize(
    "serde, value",
    [
        (BytesSerde(), b"\x00\xff"),
        (StrSerde(), "żółw"),
        (IntSerde(), -42),
        (JsonSerde(), {"a": [1, 2.5, None]}),
    ],
)
def test_serializers_round_trip(serde, value):
    assert serde.loads(serde.dumps(value)) == value
    assert resolve_serde(serde.name).name == serde.name


def test_serializers_reject_bad_input_clearly():
    assert IntSerde().loads(b"123") == 123
    with pytest.raises(ValueError, match="invalid JSON"):
        JsonSerde().loads(b"{nope")
    with pytest.raises(ValueError, match="8-byte"):
        IntSerde().loads(b"abc")
    with pytest.raises(TypeError):
        StrSerde().dumps(5)
    with pytest.raises(ConfigurationError, match="unknown serializer"):
        resolve_serde("avro")


def test_a_value_the_serializer_refuses_fails_in_set_and_leaves_no_trace(transaction):
    state = transaction.states["totals"]
    transaction.begin_message(b"A", 0)
    state.set("total", 1)
    transaction.accept_message(0)
    transaction.begin_message(b"A", 1)
    state.set("total", 2)

    with pytest.raises(StateSerializationError) as raised:
        state.set("tags", {"x", "y"})  # JSON has no sets

    message = str(raised.value)
    assert "'tags'" in message and "'totals'" in message and "set" in message and "json" in message, message
    transaction.discard_message()
    assert list(transaction.changes("totals")) == [(message_prefix(b"A") + b"total", b"1", 0)]


def test_a_commits_aggregates_are_serialized_together_and_a_refused_one_is_named_by_its_key():
    serialize = LiveSerializer("totals", JsonSerde())
    keys = [b"a", b"b", b"c"]

    assert serialize.many(keys, [1, [2, 3], {"sum": 4.5}]) == [b"1", b"[2,3]", b'{"sum":4.5}']
    with pytest.raises(StateSerializationError, match=r"store key b'b' of store 'totals'.*'json' state serializer"):
        serialize.many(keys, [1, {2, 3}, 4])
    assert LiveSerializer("counts", IntSerde()).many([b"a"], [7]) == [IntSerde().dumps(7)]


@pytest.mark.parametrize(
    "values",
    [
        [0, -7, 12_345_678_901, 2.5, -1e-9, True, None, "no comma"],
        [1, "a, b", 3],
        [[1, 2], {"sum": 4.5, "count": 2}, 3],
        [{"x": "y"}],
    ],
    ids=["numbers", "a-string-with-a-comma", "containers", "one-object"],
)
def test_aggregates_serialized_together_are_each_values_own_json(values):
    keys = [f"key-{i}".encode() for i in range(len(values))]

    assert LiveSerializer("totals", JsonSerde()).many(keys, values) == [orjson.dumps(value) for value in values]


def test_get_returns_a_new_object_so_in_place_changes_count_only_when_set(transaction):
    state = transaction.states["totals"]
    transaction.begin_message(b"A", 0)
    state.set("record", {"n": 1})
    transaction.accept_message(0)

    transaction.begin_message(b"A", 1)
    record = state.get("record")
    record["n"] = 999  # mutated, then the message fails
    transaction.discard_message()
    assert state.get("record") == {"n": 1}
    assert state.get("record") is not state.get("record")

    transaction.begin_message(b"A", 1)
    record = state.get("record")
    record["n"] += 1
    state.set("record", record)
    record["n"] = 555  # after set: the stored bytes are already taken
    transaction.accept_message(1)
    assert list(transaction.changes("totals")) == [(message_prefix(b"A") + b"record", b'{"n":2}', 1)]


def test_cached_json_values_cost_their_size_not_a_serializer_buffer(transaction):
    """orjson's own output keeps the 4 KiB buffer it was written in; a store of 1M keys would hold
    4 GiB in the record cache for values of a few bytes."""
    keys = [f"c{k}".encode() for k in range(5000)]
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for offset, key in enumerate(keys):
            transaction.begin_message(key, offset)
            transaction.states["totals"].set("total", offset)
            transaction.accept_message(offset)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert (held - before) / len(keys) < 500, "bytes held per cached entry"
