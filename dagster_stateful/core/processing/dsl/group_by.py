"""Re-keying: what `StreamingDataFrame.group_by` declares.

Owns `GroupBy`: the new key of each record (a field of its value, or a function of it), the name
of the re-keying (which names the repartition topic), the repartition topic's partition count, and
the stateless steps declared before it, which run on the source's records before they are sent,
under their new key, to the repartition topic (Kafka Streams' `groupBy`/`selectKey` with its
repartition topic, Quix Streams' `group_by`). A record whose new key cannot be had (no such field,
the function raised or returned None) is the error policy's, as any step's failure. Also
`refuse_group_by`, the steps a re-keying may not follow.
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


def refuse_group_by(grouping: GroupBy | None, windowed: bool, graced_joins: list[str], stateful: list[str]) -> None:
    """Refuse a `group_by` after another one (`grouping`), after a windowed aggregation, after joins
    with a grace (the tables `graced_joins`) or after stateful steps (named in `stateful`)."""
    if grouping is not None:
        raise ConfigurationError(
            f"this app already re-keys its records with group_by {grouping.name!r}; one group_by per app"
        )
    if windowed:
        raise ConfigurationError(
            "group_by cannot follow a windowed aggregation: its results belong to windows. Re-key the records "
            "before the window (group_by first, then the window)."
        )
    if graced_joins:
        raise ConfigurationError(
            f"a join with a grace (tables {graced_joins}) cannot come before group_by: records wait for the grace in "
            "the partitions of the state they update. Declare the join after group_by, or without grace=."
        )
    if stateful:
        raise ConfigurationError(
            f"group_by cannot follow stateful steps ({', '.join(stateful)}): their state is kept by the source's "
            "key and partition, the steps after it by the new key. Declare group_by before them."
        )
