"""dagster-stateful: Kafka-Streams-style stateful stream processing, orchestrated by Dagster.

What a Dagster user imports lives here: `build_stateful_definitions` (or, in a dg project's
`defs.yaml`, `StatefulAppComponent`), the resources (`KafkaResource`, `StateStoreResource`, and
for Spark `StatefulSparkResource` or `SparkPipesResource`) and `StatefulTranslator`. The engine's API is
`dagster_stateful.core` (`App`, `State`, listeners, errors). The package is layered: `core` is the
engine (no dagster or pyspark import), `spark` holds PySpark jobs, `local_kafka` runs a real broker
for development and tests, and the top-level modules are the thin Dagster layer. The Dagster
names are imported on first use, so `import dagster_stateful.core` never loads Dagster.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dagster_stateful.builder import build_stateful_definitions
    from dagster_stateful.component import StatefulAppComponent
    from dagster_stateful.pipes import SparkPipesResource
    from dagster_stateful.resources import KafkaResource, StatefulSparkResource, StateStoreResource
    from dagster_stateful.translator import StatefulTranslator

__version__ = "0.1.0"

_EXPORTS = {
    "build_stateful_definitions": "dagster_stateful.builder",
    "StatefulAppComponent": "dagster_stateful.component",
    "KafkaResource": "dagster_stateful.resources",
    "StateStoreResource": "dagster_stateful.resources",
    "StatefulSparkResource": "dagster_stateful.resources",
    "SparkPipesResource": "dagster_stateful.pipes",
    "StatefulTranslator": "dagster_stateful.translator",
}

__all__ = [
    "KafkaResource",
    "SparkPipesResource",
    "StateStoreResource",
    "StatefulAppComponent",
    "StatefulSparkResource",
    "StatefulTranslator",
    "build_stateful_definitions",
]


def __dir__() -> list[str]:
    """The lazy names too: dg finds `StatefulAppComponent` by listing the package."""
    return sorted({*globals(), *_EXPORTS})


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dagster_stateful' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
