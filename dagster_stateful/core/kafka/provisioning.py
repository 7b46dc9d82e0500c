"""Provisioning: every topic an app needs, printed, created where missing, validated where present.

Owns `TopicSpec` (name, role, partitions, replication factor, config) and `ProvisioningPlan`,
which compares the specs with the cluster. Operators who must create topics by hand print the
plan; workers apply it (create what is missing, if allowed). Changelogs must match the partition
count of the topic that owns the state (state partition N is its partition N): the source, or the
repartition topic of an app that re-keys, which is created with the source's count unless its
`group_by` sets one and must keep it. Output and dead-letter topics are created with the source's
count but may have any. A changelog with the wrong partition count or
cleanup policy is an error naming the topic, what was found, what was expected and what to do; an
existing topic is never changed silently. Replication factors default to -1, the brokers'
`default.replication.factor` (as in Kafka Streams), printed as "default".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from dagster_stateful.core.config import AppConfig, ErrorPolicy
from dagster_stateful.core.kafka.clients import DEFAULT_REPLICATION, KafkaClients, describe_replication
from dagster_stateful.core.kafka.descriptions import TopicLayout
from dagster_stateful.errors import TopicMismatchError, TopicMissingError

log = logging.getLogger(__name__)


class TopicRole(StrEnum):
    SOURCE = "source"
    GLOBAL_TABLE = "global-table"
    TABLE = "table"
    JOINED_STREAM = "joined-stream"
    REPARTITION = "repartition"
    CHANGELOG = "changelog"
    OUTPUT = "output"
    DEAD_LETTER = "dead-letter"


class TopicStatus(StrEnum):
    OK = "ok"
    MISSING = "missing"
    CREATED = "created"
    MISMATCH = "mismatch"


@dataclass(frozen=True)
class TopicSpec:
    name: str
    role: TopicRole
    partitions: int | None
    """What a changelog must have, what an output or dead-letter topic is created with; None: not
    known yet (before `inspect`), or whatever the topic has (the source topic)."""
    replication_factor: int = DEFAULT_REPLICATION
    """-1: the brokers' default.replication.factor."""
    config: dict[str, str] = field(default_factory=dict)

    @property
    def managed(self) -> bool:
        """Topics the app may create; the source and table topics belong to their producers."""
        return self.role not in (TopicRole.SOURCE, TopicRole.GLOBAL_TABLE, TopicRole.TABLE, TopicRole.JOINED_STREAM)

    @property
    def needs_source_partitions(self) -> bool:
        """Changelogs (state partition N is restored from changelog partition N for task partition N)
        and repartition topics (whose partitions the state already belongs to)."""
        return self.role in (TopicRole.CHANGELOG, TopicRole.REPARTITION)


class TopicAspect(StrEnum):
    """What of a topic can fail to match what the app needs."""

    EXISTS = "exists"
    PARTITIONS = "partitions"
    CLEANUP_POLICY = "cleanup.policy"


@dataclass
class TopicCheck:
    spec: TopicSpec
    status: TopicStatus
    found_partitions: int | None = None
    found_replication: int | None = None
    found_config: dict[str, str] = field(default_factory=dict)
    """The topic's settings, read for changelogs."""
    mismatches: dict[TopicAspect, str] = field(default_factory=dict)
    """What does not match, each with what to do about it."""
    warnings: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return list(self.mismatches.values())


@dataclass
class ProvisioningPlan:
    checks: list[TopicCheck]

    @property
    def problems(self) -> list[str]:
        return [problem for check in self.checks for problem in check.problems]

    def check(self, name: str) -> TopicCheck:
        return next(check for check in self.checks if check.spec.name == name)

    def describe(self) -> str:
        """A table an operator can follow to create the topics by hand (replication "default": leave it
        to the brokers' default.replication.factor; in brackets what an existing topic has)."""
        lines = [f"{'role':<12} {'topic':<48} {'partitions':>10} {'replication':<13} {'status':<9} config"]
        for check in self.checks:
            spec = check.spec
            config = ",".join(f"{k}={v}" for k, v in sorted(spec.config.items())) or "-"
            lines.append(
                f"{spec.role.value:<12} {spec.name:<48} {_partitions_cell(check):>10} {_replication_cell(check):<13} "
                f"{check.status.value:<9} {config}"
            )
            lines.extend(f"{'':<12} ! {problem}" for problem in check.problems)
            lines.extend(f"{'':<12} ~ {warning}" for warning in check.warnings)
        return "\n".join(lines)


def _partitions_cell(check: TopicCheck) -> str:
    """What a changelog needs; what other topics have (or are created with)."""
    spec = check.spec
    needed = spec.partitions if spec.needs_source_partitions else None
    shown = needed if needed is not None else (check.found_partitions or spec.partitions)
    return "?" if shown is None else str(shown)


def _replication_cell(check: TopicCheck) -> str:
    spec, found = check.spec, check.found_replication
    if not spec.managed:
        return "?" if found is None else str(found)
    wanted = describe_replication(spec.replication_factor)
    if found is None or found == spec.replication_factor:
        return wanted
    return f"{wanted} ({found})" if spec.replication_factor == DEFAULT_REPLICATION else f"{wanted} (has {found})"


REPARTITION_TOPIC_CONFIG = {"cleanup.policy": "delete", "retention.ms": "-1", "segment.bytes": str(50 * 1024 * 1024)}
"""What Kafka Streams gives its repartition topics: kept until the app purges what it consumed and
committed (DeleteRecords), in segments small enough for the purge to free space."""

StoreConfigs = Mapping[str, Mapping[str, str]]
"""Changelog topic settings by store, over the app's `changelog_config` (a window store's retention)."""


def app_topic_specs(config: AppConfig, store_configs: StoreConfigs | None = None) -> list[TopicSpec]:
    """Every topic the app reads or writes, with what the app needs of it."""
    replication, store_configs = config.changelog_replication_factor, store_configs or {}
    specs = [TopicSpec(config.source, TopicRole.SOURCE, None)]
    specs += [TopicSpec(topic, TopicRole.GLOBAL_TABLE, None) for topic in config.global_tables.values()]
    # `inspect` checks a table against the topic listed last before it: the source for these.
    specs += _table_specs(config, before_rekeying=True)
    if config.repartition is not None and config.repartition_topic is not None:
        specs.append(
            TopicSpec(
                config.repartition_topic,
                TopicRole.REPARTITION,
                config.repartition.partitions,
                replication,
                dict(REPARTITION_TOPIC_CONFIG),
            )
        )
    specs += [
        TopicSpec(topic, TopicRole.CHANGELOG, None, replication, _changelog_config(config, store_configs, store))
        for store, topic in (config.changelog_topics() or {}).items()
    ]
    specs += _table_specs(config, before_rekeying=False)
    specs += [TopicSpec(topic, TopicRole.JOINED_STREAM, None) for topic in config.joined_streams.values()]
    if config.emits_output and config.output:
        specs.append(TopicSpec(config.output, TopicRole.OUTPUT, None, replication))
    if config.on_error is ErrorPolicy.DEAD_LETTER:
        specs.append(TopicSpec(config.dead_letter_topic, TopicRole.DEAD_LETTER, None, replication))
    return specs


def _table_specs(config: AppConfig, before_rekeying: bool) -> list[TopicSpec]:
    """The partitioned tables joined before the re-keying (on the source's key), or the others."""
    return [
        TopicSpec(topic, TopicRole.TABLE, None)
        for name, topic in config.tables.items()
        if config.joined_before_rekeying(name) == before_rekeying
    ]


def _changelog_config(config: AppConfig, store_configs: StoreConfigs, store: str) -> dict[str, str]:
    return {**config.changelog_config, **store_configs.get(store, {})}


def provisioning_plan(
    config: AppConfig, kafka: KafkaClients, store_configs: StoreConfigs | None = None
) -> ProvisioningPlan:
    """The app's topics compared with the cluster (changes nothing)."""
    return inspect(app_topic_specs(config, store_configs), kafka)


def provision(
    config: AppConfig, kafka: KafkaClients, create: bool | None = None, store_configs: StoreConfigs | None = None
) -> ProvisioningPlan:
    """Create the app's missing internal topics (unless `create`, by default `auto_create_topics`, is
    False) and validate the rest."""
    plan = provisioning_plan(config, kafka, store_configs)
    return apply(plan, kafka, config.auto_create_topics if create is None else create)


def inspect(specs: list[TopicSpec], kafka: KafkaClients) -> ProvisioningPlan:
    """Compare the specs with the cluster, changing nothing."""
    source_partitions = task_partitions = None
    state_topic = "source"
    checks = []
    for spec in specs:
        layout = kafka.topic_layout(spec.name)
        if spec.role is TopicRole.SOURCE:
            source_partitions = task_partitions = None if layout is None else layout.partitions
        if spec.role in (TopicRole.TABLE, TopicRole.JOINED_STREAM):
            expected = task_partitions
        elif not spec.managed:
            expected = None
        elif spec.partitions is not None:
            expected = spec.partitions
        else:
            expected = task_partitions if spec.role is TopicRole.CHANGELOG else source_partitions
        if spec.role is TopicRole.REPARTITION:
            task_partitions, state_topic = expected, "repartition"
        spec = TopicSpec(spec.name, spec.role, expected, spec.replication_factor, spec.config)
        checks.append(_check(spec, layout, kafka, state_topic))
    return ProvisioningPlan(checks)


def _check(spec: TopicSpec, layout: TopicLayout | None, kafka: KafkaClients, state_topic: str = "source") -> TopicCheck:
    """`state_topic`: which topic owns the state ("source" or "repartition"), named when a
    changelog's partition count does not match it."""
    if layout is None:
        check = TopicCheck(spec, TopicStatus.MISSING)
        if spec.role is TopicRole.SOURCE:
            check.mismatches[TopicAspect.EXISTS] = (
                f"source topic {spec.name} does not exist; create it (or fix the app's `source`) before running the app"
            )
        elif spec.role in (TopicRole.GLOBAL_TABLE, TopicRole.TABLE):
            check.mismatches[TopicAspect.EXISTS] = (
                f"{_table_kind(spec)} topic {spec.name} does not exist; create it (compacted) before running the app"
            )
        elif spec.role is TopicRole.JOINED_STREAM:
            check.mismatches[TopicAspect.EXISTS] = (
                f"joined stream topic {spec.name} does not exist; create it, co-partitioned with the app's "
                f"{state_topic} topic, before running the app"
            )
        return check
    check = TopicCheck(spec, TopicStatus.OK, layout.partitions, layout.replication_factor)
    if spec.role is TopicRole.SOURCE:
        return check
    if spec.role in (TopicRole.GLOBAL_TABLE, TopicRole.TABLE):
        _check_table_topic(spec, kafka, check)
        _check_co_partitioned(spec, layout.partitions, state_topic, check)
        return check
    if spec.role is TopicRole.JOINED_STREAM:
        _check_co_partitioned(spec, layout.partitions, state_topic, check)
        return check
    _check_replication(spec, layout.replication_factor, check)
    found_partitions = layout.partitions
    if spec.needs_source_partitions and spec.partitions is not None and found_partitions != spec.partitions:
        owner = "the app's group_by asks for" if spec.role is TopicRole.REPARTITION else f"the {state_topic} topic has"
        check.mismatches[TopicAspect.PARTITIONS] = (
            f"{spec.role.value} topic {spec.name} has {found_partitions} partitions but {owner} "
            f"{spec.partitions}; state partition N must map to partition N of the topic that owns the state. "
            f"Delete and recreate {spec.name} with {spec.partitions} partitions (state is then restored from "
            "scratch), or repartition the source to match."
        )
    if spec.role is TopicRole.CHANGELOG:
        check.found_config = kafka.topic_config(spec.name)
        _check_changelog_config(spec, check.found_config, check)
    if check.problems:
        check.status = TopicStatus.MISMATCH
    return check


def _check_table_topic(spec: TopicSpec, kafka: KafkaClients, check: TopicCheck) -> None:
    """A table's topic must be compacted: deleting by retention would drop keys the table holds."""
    check.found_config = kafka.topic_config(spec.name)
    policy = check.found_config.get("cleanup.policy", "delete")
    if "compact" not in cleanup_policies(policy):
        check.mismatches[TopicAspect.CLEANUP_POLICY] = (
            f"{_table_kind(spec)} topic {spec.name} has cleanup.policy={policy}: a table reads the latest value of "
            "every key, which deletion by retention would lose. Compact it: `kafka-configs --alter "
            f"--entity-type topics --entity-name {spec.name} --add-config cleanup.policy=compact`."
        )
        check.status = TopicStatus.MISMATCH


def _table_kind(spec: TopicSpec) -> str:
    return "global table" if spec.role is TopicRole.GLOBAL_TABLE else "table"


def _check_co_partitioned(spec: TopicSpec, found: int, state_topic: str, check: TopicCheck) -> None:
    """A partitioned table's partition N is joined with the records of task partition N: the topics
    must have as many partitions, and the same producers' partitioner (not checked: Kafka cannot tell)."""
    if spec.role not in (TopicRole.TABLE, TopicRole.JOINED_STREAM) or spec.partitions is None:
        return
    if found == spec.partitions:
        return
    if spec.role is TopicRole.JOINED_STREAM:
        check.mismatches[TopicAspect.PARTITIONS] = (
            f"joined stream topic {spec.name} has {found} partitions but the {state_topic} topic the app joins it "
            f"with has {spec.partitions}: an interval join needs them co-partitioned (the same key in the same "
            f"partition number of both). Re-key the stream with group_by(..., partitions={found}), or repartition "
            f"{spec.name} to {spec.partitions} partitions."
        )
        check.status = TopicStatus.MISMATCH
        return
    check.mismatches[TopicAspect.PARTITIONS] = (
        f"table topic {spec.name} has {found} partitions but the {state_topic} topic the app joins it with has "
        f"{spec.partitions}: the join needs them co-partitioned (the same key in the same partition number of both). "
        f"Re-key the stream with group_by(..., partitions={found}), repartition the table's topic to "
        f"{spec.partitions} partitions, or join a global table (App.global_table) instead."
    )
    check.status = TopicStatus.MISMATCH


def _check_replication(spec: TopicSpec, found: int, check: TopicCheck) -> None:
    if spec.replication_factor != DEFAULT_REPLICATION and found != spec.replication_factor:
        check.warnings.append(
            f"replication factor is {found}, the app asks for {spec.replication_factor} (left unchanged; "
            "raise it with `kafka-reassign-partitions`, or set changelog_replication_factor to match)"
        )


def _check_changelog_config(spec: TopicSpec, found: dict[str, str], check: TopicCheck) -> None:
    policy, wanted_policy = found.get("cleanup.policy", "delete"), spec.config.get("cleanup.policy", "compact")
    if cleanup_policies(policy) != cleanup_policies(wanted_policy):
        check.mismatches[TopicAspect.CLEANUP_POLICY] = (
            f"changelog topic {spec.name} has cleanup.policy={policy}, expected {wanted_policy}: "
            + (
                "with deletion by retention, state older than the retention would be lost on restore"
                if wanted_policy == "compact"
                else "a window store's changelog is compacted, and deleted past the store's retention"
            )
            + f". Set it with `kafka-configs --alter --entity-type topics --entity-name {spec.name} "
            f"--add-config cleanup.policy=[{wanted_policy}]`."
        )
    for key, wanted in spec.config.items():
        if key != "cleanup.policy" and found.get(key) not in (None, wanted):
            check.warnings.append(f"{key} is {found.get(key)}, the app asks for {wanted} (left unchanged)")


def cleanup_policies(policy: str) -> frozenset[str]:
    """The policies of a `cleanup.policy` value ("compact,delete", "[compact, delete]", ...)."""
    return frozenset(part.strip() for part in policy.strip("[]").split(",") if part.strip())


def apply(plan: ProvisioningPlan, kafka: KafkaClients, create: bool = True) -> ProvisioningPlan:
    """Create missing managed topics (when `create`), then fail on any problem left."""
    for check in plan.checks:
        if not check.spec.managed and check.status is TopicStatus.MISSING:
            raise TopicMissingError(check.problems[0])
    for check in plan.checks:
        if check.status is TopicStatus.MISSING and check.spec.managed and create:
            spec = check.spec
            kafka.create_topic(spec.name, spec.partitions or 1, spec.replication_factor, spec.config)
            check.status = TopicStatus.CREATED
            layout = kafka.topic_layout(spec.name)
            check.found_partitions = spec.partitions if layout is None else layout.partitions
            check.found_replication = None if layout is None else layout.replication_factor
    missing = [c.spec.name for c in plan.checks if c.status is TopicStatus.MISSING and c.spec.managed]
    if plan.problems:
        raise TopicMismatchError("the app's topics do not match what it needs:\n  " + "\n  ".join(plan.problems))
    if missing:
        raise TopicMissingError(
            f"topics {missing} do not exist and automatic creation is off; create them as "
            f"the provisioning plan says:\n{plan.describe()}"
        )
    return plan
