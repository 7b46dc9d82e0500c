"""The stateful engine: apps, per-partition RocksDB state stores, changelog topics, recovery and
bounded workers. Plain Python: never imports dagster or pyspark.

What an engine user imports lives here: `App` (the façade) and `AppConfig`, `State`, `Store`, the
aggregators (`Count`, `Sum`, `Min`, `Max`, `Mean`, `Reduce`, `Collect`, `Aggregate`), the serializers,
the listeners, the reports and the error hierarchy. The sub-packages hold the parts:
`state/` (local storage), `kafka/` (clients and topics), `recovery/` (restores), `processing/`
(steps and the worker) and `monitoring/` (reports, listeners, lag).

The names are imported on first use, so that a process needing one part (a child process replaying
a changelog) does not load them all.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from dagster_stateful.core.app import App
    from dagster_stateful.core.config import AppConfig, ErrorPolicy, ProcessingGuarantee
    from dagster_stateful.core.monitoring.listeners import AppState, RestoreListener, StateListener
    from dagster_stateful.core.monitoring.report import RestoreKind, RestoreReport, StopReason, WorkerReport
    from dagster_stateful.core.processing.dsl.aggregations import (
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
    from dagster_stateful.core.processing.dsl.dataframe import StreamingDataFrame
    from dagster_stateful.core.queries.key_location import KeyLocation
    from dagster_stateful.core.queries.key_reads import KeyRead, StateCopy
    from dagster_stateful.core.recovery.planner import RestoreMethod, RestorePath
    from dagster_stateful.core.state.kv import State
    from dagster_stateful.core.state.serialization import BytesSerde, IntSerde, JsonSerde, Serde, StrSerde
    from dagster_stateful.core.state.stores import Store
    from dagster_stateful.core.state.timers import Timer

_EXPORTS = {
    "App": "dagster_stateful.core.app",
    "AppConfig": "dagster_stateful.core.config",
    "ErrorPolicy": "dagster_stateful.core.config",
    "ProcessingGuarantee": "dagster_stateful.core.config",
    "AppState": "dagster_stateful.core.monitoring.listeners",
    "RestoreListener": "dagster_stateful.core.monitoring.listeners",
    "StateListener": "dagster_stateful.core.monitoring.listeners",
    "KeyLocation": "dagster_stateful.core.queries.key_location",
    "KeyRead": "dagster_stateful.core.queries.key_reads",
    "StateCopy": "dagster_stateful.core.queries.key_reads",
    "RestoreKind": "dagster_stateful.core.monitoring.report",
    "RestoreReport": "dagster_stateful.core.monitoring.report",
    "StopReason": "dagster_stateful.core.monitoring.report",
    "WorkerReport": "dagster_stateful.core.monitoring.report",
    "Aggregate": "dagster_stateful.core.processing.dsl.aggregations",
    "Aggregator": "dagster_stateful.core.processing.dsl.aggregations",
    "Collect": "dagster_stateful.core.processing.dsl.aggregations",
    "Count": "dagster_stateful.core.processing.dsl.aggregations",
    "Max": "dagster_stateful.core.processing.dsl.aggregations",
    "Mean": "dagster_stateful.core.processing.dsl.aggregations",
    "Min": "dagster_stateful.core.processing.dsl.aggregations",
    "Reduce": "dagster_stateful.core.processing.dsl.aggregations",
    "Sum": "dagster_stateful.core.processing.dsl.aggregations",
    "StreamingDataFrame": "dagster_stateful.core.processing.dsl.dataframe",
    "RestoreMethod": "dagster_stateful.core.recovery.planner",
    "RestorePath": "dagster_stateful.core.recovery.planner",
    "State": "dagster_stateful.core.state.kv",
    "BytesSerde": "dagster_stateful.core.state.serialization",
    "IntSerde": "dagster_stateful.core.state.serialization",
    "JsonSerde": "dagster_stateful.core.state.serialization",
    "Serde": "dagster_stateful.core.state.serialization",
    "StrSerde": "dagster_stateful.core.state.serialization",
    "Store": "dagster_stateful.core.state.stores",
    "Timer": "dagster_stateful.core.state.timers",
}

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
    "KeyLocation",
    "KeyRead",
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
    "StateCopy",
    "StateListener",
    "StateLockedError",
    "StateStoreError",
    "StatefulError",
    "StopReason",
    "Store",
    "StrSerde",
    "StreamingDataFrame",
    "Sum",
    "Timer",
    "TopicMismatchError",
    "TopicMissingError",
    "WorkerReport",
]


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dagster_stateful.core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
