"""The arithmetic of `describe_inputs`'s answer (its reads of a real broker are tested through the lag
sensor, tests/dagster/test_lag_sensor_inputs.py): stream lag from the committed offset or, never
committed, from the low watermark; table lag summed per table; a global table's size."""

from __future__ import annotations

from dagster_stateful.core.queries.input_lag import GlobalTableSize, InputsLag, StreamPartitionLag
from dagster_stateful.core.queries.tables import TablePartitionDescription


def table_partition(table: str, partition: int, not_applied: int) -> TablePartitionDescription:
    return TablePartitionDescription(
        table=table,
        topic=f"{table}-topic",
        partition=partition,
        committed_position=None,
        topic_low=0,
        topic_end=not_applied,
        records_not_applied=not_applied,
        position_valid=True,
        local_copy=False,
    )


def test_stream_lag_counts_from_the_committed_offset_or_the_low_watermark():
    committed = StreamPartitionLag("orders", 0, committed=7, low=5, high=10)
    never = StreamPartitionLag("orders", 1, committed=None, low=5, high=10)
    inputs = InputsLag(
        streams={"orders": {0: committed, 1: never}, "orders-by-region-repartition": {0: committed}},
        tables=[],
        global_tables=[],
    )

    assert (committed.lag, never.lag) == (3, 5)
    assert inputs.stream_lag == 3 + 5 + 3, "every stream input counts"


def test_table_lag_is_summed_per_table_and_a_global_table_by_its_offsets():
    inputs = InputsLag(
        streams={},
        tables=[table_partition("profiles", 0, 4), table_partition("profiles", 1, 2), table_partition("prices", 0, 0)],
        global_tables=[GlobalTableSize("regions", "zones", {0: (3, 10), 1: (0, 0)})],
    )

    assert inputs.table_lag() == {"profiles": 6, "prices": 0}
    assert inputs.stream_lag == 0
    [regions] = inputs.global_tables
    assert regions.records_at_most == 7 and regions.ends == {0: 10, 1: 0}
