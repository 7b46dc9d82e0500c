"""A damaged store met inside a step is the store's failure, not the message's (real RocksDB, no Kafka).

`StreamingDataFrame.run` turns what a step raises into `StepFailed`, which the error policy may
skip or dead-letter; a `StoreCorruptedError` from a state read must pass through unwrapped, or a
worker under on_error="skip" would skip every message of a damaged partition and commit past them.
"""

from __future__ import annotations

import pytest
from support.state_damage import MESSAGE_KEY, STATE_KEYS, committed_store, damage_data_block

from dagster_stateful.core import JsonSerde, State
from dagster_stateful.core.processing.dsl.dataframe import StepFailed, StreamingDataFrame
from dagster_stateful.core.state.transaction import PartitionTransaction
from dagster_stateful.errors import StoreCorruptedError


def read_every_key(value: dict, state: State) -> dict:
    for state_key in STATE_KEYS:
        state.get(state_key)
    return value


def test_a_corrupted_store_read_in_a_step_propagates_unwrapped(tmp_path):
    state_dir = committed_store(tmp_path)
    damage_data_block(state_dir.partition_path("totals", 0))
    part = state_dir.partition("totals", 0)
    part.open()
    try:
        txn = PartitionTransaction(0, {"totals": part}, JsonSerde(), committed_offset=len(STATE_KEYS))
        sdf = StreamingDataFrame(["totals"]).update(read_every_key, stateful=True)

        txn.begin_message(MESSAGE_KEY, len(STATE_KEYS))
        with pytest.raises(StoreCorruptedError) as raised:
            sdf.run({"amount": 1}, txn.states)

        assert not isinstance(raised.value, StepFailed)
        assert raised.value.path == str(part.path) and raised.value.partition == 0
    finally:
        part.close()


def test_other_step_errors_are_still_step_failures(tmp_path):
    def broken(value: dict) -> dict:
        raise KeyError("amount")

    with pytest.raises(StepFailed, match="broken"):
        StreamingDataFrame(["totals"]).apply(broken).run({}, {})


def double(value: int) -> int:
    return value * 2


def is_even(value: int) -> bool:
    return value % 2 == 0


def remember(value: int, state: dict) -> None:
    state["seen"] = value


@pytest.mark.parametrize(
    "build",
    [
        lambda sdf: sdf.apply(double),
        lambda sdf: sdf.update(remember, stateful=True),
        lambda sdf: sdf.filter(is_even),
        lambda sdf: sdf.apply(double).filter(is_even).update(remember, stateful=True),
    ],
    ids=["one apply", "one stateful update", "one filter", "three steps"],
)
def test_the_compiled_frame_computes_what_run_does(build):
    by_run: dict[str, dict] = {"totals": {}}
    by_compiled: dict[str, dict] = {"totals": {}}
    sdf = build(StreamingDataFrame(["totals"]))
    compiled = sdf.compiled()

    values = range(-3, 4)
    assert [compiled(value, by_compiled) for value in values] == [sdf.run(value, by_run) for value in values]
    assert by_compiled == by_run


def test_the_compiled_frame_wraps_step_errors_and_passes_store_damage_through():
    def damaged(value: int, state: dict) -> None:
        raise StoreCorruptedError("damaged block", store="totals", partition=0, path="/state/totals/0")

    with pytest.raises(StepFailed, match="double"):
        StreamingDataFrame(["totals"]).apply(double).compiled()(None, {})
    with pytest.raises(StoreCorruptedError):
        StreamingDataFrame(["totals"]).update(damaged, stateful=True).compiled()(1, {"totals": {}})
