"""The stateful engine: apps, per-partition RocksDB state stores, changelog topics, recovery and
bounded workers. Plain Python: never imports dagster or pyspark. Kafka is reached only through
`kafka`, RocksDB only through `rocksdb`."""

from dagster_stateful.core.app import App, ErrorPolicy
from dagster_stateful.core.dataframe import StreamingDataFrame
from dagster_stateful.core.listeners import AppState, RestoreListener, StateListener
from dagster_stateful.core.report import RestoreReport, WorkerReport
from dagster_stateful.core.serialization import BytesSerde, IntSerde, JsonSerde, Serde, StrSerde
from dagster_stateful.core.state import State

__all__ = [
    "App", "AppState", "BytesSerde", "ErrorPolicy", "IntSerde", "JsonSerde", "RestoreListener",
    "RestoreReport", "Serde", "State", "StateListener", "StrSerde", "StreamingDataFrame", "WorkerReport",
]
