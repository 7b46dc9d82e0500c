"""Orders fed to a windowed frame and committed as a worker would, without Kafka: the window tests' shared steps."""

from __future__ import annotations

from typing import Any

from dagster_stateful.core.processing.dsl.dataframe import StreamingDataFrame
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.transaction import PartitionTransaction


def feed(
    frame: StreamingDataFrame, txn: PartitionTransaction, orders: list[tuple[str, int, int]], start: int = 0
) -> list[Any]:
    """(customer, timestamp, amount) orders through the frame, as the worker does; what each passed on."""
    outputs = []
    for offset, (customer, timestamp, value) in enumerate(orders, start):
        txn.begin_message(customer.encode(), offset)
        for window in txn.window_list:
            window.timestamp = timestamp
        outputs.append(frame.run({"customer": customer, "amount": value}, txn.views))
        txn.accept_message(offset)
    return outputs


def commit(txn: PartitionTransaction, store: StorePartition) -> None:
    """As the worker commits: expiries first, then the store's changes with the offset."""
    txn.prepare_commit()
    changes = txn.changes(store.store)
    store.commit(((key, value) for key, value, _ in changes), None, txn.offset_to_commit)
    txn.committed()
