"""The stateful engine: apps, per-partition RocksDB state stores, changelog topics, recovery and
bounded workers. Plain Python: never imports dagster or pyspark.

What an engine user imports lives here: `App` (the façade) and `AppConfig`, `State`, `Store`, the
aggregators (`Count`, `Sum`, `Min`, `Max`, `Mean`, `Reduce`, `Collect`, `Aggregate`), the serializers,
the listeners, the reports and the error hierarchy. The sub-packages hold the parts:
`state/` (local storage), `kafka/` (clients and topics), `recovery/` (restores), `processing/`
(steps and the worker) and `monitoring/` (reports, listeners, lag).
"""

from dagster_stateful.core.app import App
from dagster_stateful.core.config import AppConfig, ErrorPolicy, ProcessingGuarantee
from dagster_stateful.core.monitoring.listeners import AppState, RestoreListener, StateListener
from dagster_stateful.core.monitoring.report import RestoreKind, RestoreReport, StopReason, WorkerReport
from dagster_stateful.core.processing.aggregations import (
    Aggregate,
    Aggregator,
    Collect,
    Count,
    Max,
    Mean,
    Min,
    Reduce,
    Sum,
)
from dagster_stateful.core.processing.dataframe import StreamingDataFrame
from dagster_stateful.core.recovery.planner import RestoreMethod, RestorePath
from dagster_stateful.core.state.kv import State
from dagster_stateful.core.state.serialization import BytesSerde, IntSerde, JsonSerde, Serde, StrSerde
from dagster_stateful.core.state.stores import Store
from dagster_stateful.errors import (
    CommitTimeoutError,
    ConfigurationError,
    DeliveryError,
    KafkaAuthenticationError,
    KafkaAuthorizationError,
    KafkaOperationError,
    KafkaSecurityError,
    KafkaTlsError,
    ProcessingError,
    RecoveryError,
    StatefulError,
    StateLockedError,
    StateStoreError,
    TopicMismatchError,
    TopicMissingError,
)

__all__ = [
    "Aggregate",
    "Aggregator",
    "App",
    "AppConfig",
    "AppState",
    "BytesSerde",
    "Collect",
    "CommitTimeoutError",
    "ConfigurationError",
    "Count",
    "DeliveryError",
    "ErrorPolicy",
    "IntSerde",
    "JsonSerde",
    "KafkaAuthenticationError",
    "KafkaAuthorizationError",
    "KafkaOperationError",
    "KafkaSecurityError",
    "KafkaTlsError",
    "Max",
    "Mean",
    "Min",
    "ProcessingError",
    "ProcessingGuarantee",
    "RecoveryError",
    "Reduce",
    "RestoreKind",
    "RestoreListener",
    "RestoreMethod",
    "RestorePath",
    "RestoreReport",
    "Serde",
    "State",
    "StateListener",
    "StateLockedError",
    "StateStoreError",
    "StatefulError",
    "StopReason",
    "Store",
    "StrSerde",
    "StreamingDataFrame",
    "Sum",
    "TopicMismatchError",
    "TopicMissingError",
    "WorkerReport",
]
