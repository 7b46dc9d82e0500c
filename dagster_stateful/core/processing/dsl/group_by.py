"""Re-keying: what `StreamingDataFrame.group_by` declares.

Owns `GroupBy`: the new key of each record (a field of its value, or a function of it), the name
of the re-keying (which names the repartition topic), the repartition topic's partition count, and
the stateless steps declared before it, which run on the source's records before they are sent,
under their new key, to the repartition topic (Kafka Streams' `groupBy`/`selectKey` with its
repartition topic, Quix Streams' `group_by`). A record whose new key cannot be had (no such field,
the function raised or returned None) is the error policy's, as any step's failure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dagster_stateful.core.processing.dsl.steps import Chain, StepFailed, field_reader
from dagster_stateful.errors import ConfigurationError

KeyOf = Callable[[Any], Any]


@dataclass(frozen=True)
class GroupBy:
    key: KeyOf
    """The record's new key, from its value after the steps before the re-keying."""
    name: str
    """Names the repartition topic `<app>-<name>-repartition`."""
    partitions: int | None
    """The repartition topic's partition count (None: the source's)."""
    before: Chain
    """The stateless steps declared before the re-keying, as the hot path runs them."""

    @classmethod
    def define(cls, key: str | KeyOf, name: str | None, partitions: int | None, before: Chain) -> GroupBy:
        if isinstance(key, str):
            return cls(field_reader(key, f"group_by {key!r}"), name or key, partitions, before)
        if not callable(key):
            raise ConfigurationError(f"group_by needs a field name or a function of the value, got {key!r}")
        if name is None:
            raise ConfigurationError(
                "group_by with a function needs a name=... (it names the repartition topic, which must stay the "
                "same from one deployment to the next)"
            )
        return cls(key, name, partitions, before)

    def new_key(self, value: Any) -> Any:
        """The value's new key; `StepFailed` when it has none."""
        try:
            key = self.key(value)
        except Exception as error:
            raise StepFailed(f"group_by {self.name}", error) from error
        if key is None:
            raise StepFailed(f"group_by {self.name}", ValueError("the new key is None"))
        return key
