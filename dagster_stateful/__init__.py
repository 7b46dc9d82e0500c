"""dagster-stateful: Kafka-Streams-style stateful stream processing, orchestrated by Dagster.

The package is layered: `dagster_stateful.core` is the engine (no dagster or pyspark import),
`dagster_stateful.spark` holds PySpark jobs, `dagster_stateful.local_kafka` runs a real broker
for development and tests, and the top-level modules are the thin Dagster layer.
"""

__version__ = "0.1.0"
