"""The one error hierarchy of dagster-stateful.

Every error the project raises on purpose derives from `StatefulError`. Messages say what
happened, where (topic, partition, offset, path) and what the operator can do about it. This
module imports nothing from dagster or pyspark so the core engine can use it.
"""

from __future__ import annotations


class StatefulError(Exception):
    """Base class of every dagster-stateful error."""


class LocalKafkaError(StatefulError):
    """The local development broker, or the jars it needs, could not be provided."""


class JavaNotFoundError(LocalKafkaError):
    """No suitable Java runtime (17+) was found."""


class PortInUseError(LocalKafkaError):
    """A port the local broker was asked to listen on is taken."""


class BrokerStartError(LocalKafkaError):
    """The broker process exited or did not answer in time."""
