"""Asset checks for what goes wrong with stateful apps in production.

Owns the checks on each changelog asset (partition count equals the source's; cleanup policy is
the store's: compact, or compact,delete for a window store; both judged by the app's provisioning
plan, the verdict the provision job and workers act on; no local stored offset beyond the
changelog's end, the sign of a recreated changelog; the group's committed source offset not below
the source's low watermark, the sign of data lost to retention; up-to-date local partitions equal
a changelog replay, by digest), on each snapshot asset (not too old; a partitioned table's
snapshot too, in one multi-asset check per app, `<app>__table_snapshot_checks`) and on each
state-store asset (local state not too far behind its changelog: evaluated by the store's own
materialization, so every worker run carries its result). Each result says what it found, where,
and what to do.

The checks of one store are one multi-asset check (`<app>__<store>_checks`): a run of several
of them is one step, which reads the topic's description and the local partitions once, instead
of a process and a Kafka connection per check. Any subset runs on its own. With a cron, each
check carries an automation condition (that cron's ticks, and each materialization of the asset it
checks), which the app's checks sensor (`automation.checks_sensor`) evaluates.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    AutomationCondition,
    MetadataValue,
    multi_asset_check,
)

from dagster_stateful.core.app import App
from dagster_stateful.core.kafka.provisioning import TopicAspect, TopicCheck, TopicStatus
from dagster_stateful.core.queries.describe import PartitionDescription
from dagster_stateful.core.queries.tables import TablePartitionDescription
from dagster_stateful.core.recovery.snapshot_format import SnapshotManifest, SnapshotStore
from dagster_stateful.core.recovery.table_snapshots import table_snapshots
from dagster_stateful.core.recovery.verification import Digest, partition_digest
from dagster_stateful.errors import StateLockedError
from dagster_stateful.naming import (
    changelog_key,
    job_name,
    snapshot_key,
    snapshot_tables,
    store_key,
    table_snapshot_key,
    table_store_key,
)
from dagster_stateful.resources import KafkaResource, StateStoreResource
from dagster_stateful.translator import DEFAULT_TRANSLATOR, StatefulTranslator

FRESHNESS_CHECK = "local_state_fresh"
SNAPSHOT_FRESH = "snapshot_fresh"
Verdict = dict[str, Any]
"""An `AssetCheckResult`'s fields other than the check's key."""


def stateful_checks(
    app: App,
    max_snapshot_age_hours: float = 48.0,
    translator: StatefulTranslator = DEFAULT_TRANSLATOR,
    check_cron: str | None = None,
) -> list[AssetChecksDefinition]:
    """The checks of the changelog and snapshot of every store of `app`, one multi-asset check per
    store; with `check_cron`, each is evaluated on that schedule and after each materialization of
    its asset by a Dagster automation-condition sensor (`automation.checks_sensor`), so it never
    stays "Not evaluated". The store's own check is part of the store asset (`freshness_check_spec`)."""
    automation = _automation(check_cron)
    stores = app.stores if app.config.use_changelog_topics else []
    checks = [_store_checks(app, store, max_snapshot_age_hours, translator, automation) for store in stores]
    if snapshot_tables(app):
        checks.append(_table_snapshot_checks(app, max_snapshot_age_hours, translator, automation))
    return checks


def _automation(check_cron: str | None) -> AutomationCondition | None:
    """At each tick of `check_cron` and after each materialization of the checked asset (which
    would otherwise leave its checks "Not evaluated"), unless the check is running already."""
    if check_cron is None:
        return None
    due = AutomationCondition.cron_tick_passed(check_cron) | AutomationCondition.any_deps_updated()
    return due & ~AutomationCondition.in_progress()


@dataclass
class _Evidence:
    """What the checks of one store read, each read at most once per run."""

    app: App
    store: str
    snapshot_root: str | None
    max_snapshot_age_hours: float

    @property
    def topic(self) -> str:
        return self.app.changelog_topic(self.store)

    @cached_property
    def planned(self) -> TopicCheck:
        """The provisioning plan's verdict on the changelog: the checks judge it as provisioning does."""
        return self.app.provisioning_plan().check(self.topic)

    @cached_property
    def partitions(self) -> list[PartitionDescription]:
        return self.app.describe_partitions(stores=[self.store])


@dataclass(frozen=True)
class _Check:
    name: str
    on_snapshot: bool
    description: str
    evaluate: Callable[[_Evidence], Verdict]


def _store_checks(
    app: App, store: str, max_age_hours: float, translator: StatefulTranslator, automation: AutomationCondition | None
) -> AssetChecksDefinition:
    checks = _checks_of(store, max_age_hours)
    keys = {
        check.name: AssetCheckKey(
            snapshot_key(app, store, translator) if check.on_snapshot else changelog_key(app, store, translator),
            check.name,
        )
        for check in checks
    }
    specs = [
        AssetCheckSpec(
            check.name, asset=keys[check.name].asset_key, description=check.description, automation_condition=automation
        )
        for check in checks
    ]

    @multi_asset_check(
        name=job_name(app, f"{store}_checks"),
        specs=specs,
        can_subset=True,
        description=f"The checks of store `{store}`'s changelog and snapshot.",
    )
    def store_checks(
        context: AssetCheckExecutionContext, kafka: KafkaResource, state_store: StateStoreResource
    ) -> Iterator[AssetCheckResult]:
        evidence = _Evidence(state_store.bind(app, kafka), store, state_store.snapshot_root, max_age_hours)
        for check in checks:
            key = keys[check.name]
            if key in context.selected_asset_check_keys:
                yield AssetCheckResult(asset_key=key.asset_key, check_name=key.name, **check.evaluate(evidence))

    return store_checks


def _checks_of(store: str, max_age_hours: float) -> list[_Check]:
    return [
        _Check(
            "partition_parity", False, "The changelog has as many partitions as the source topic.", _partition_parity
        ),
        _Check(
            "cleanup_policy_compact",
            False,
            "The changelog is compacted (and, for a window store, deleted past the store's retention only).",
            _cleanup_policy,
        ),
        _Check(
            "stored_offsets_within_changelog",
            False,
            "No local store claims a changelog offset beyond the changelog's end (a recreated changelog).",
            _stored_offsets,
        ),
        _Check(
            "committed_offsets_retained",
            False,
            "The group's committed source offsets are not below the source's low watermark.",
            _committed_retained,
        ),
        # On the changelog, not the store: it runs on its own schedule, and a check of the store not
        # evaluated by the store's own materialization would show "not evaluated" after every worker run.
        _Check(
            "matches_changelog_replay",
            False,
            f"Each local partition of store `{store}` that is up to date (a bulk restore, say) has the same content "
            "as the store a replay of this changelog gives (SHA-256 digests).",
            _matches_replay,
        ),
        _Check(SNAPSHOT_FRESH, True, f"The latest snapshot is younger than {max_age_hours:g} hours.", _snapshot_fresh),
    ]


def _partition_parity(evidence: _Evidence) -> Verdict:
    check = evidence.planned
    if check.status is TopicStatus.MISSING:
        return {"passed": False, "description": f"{evidence.topic} does not exist: run the provision job."}
    if check.spec.partitions is None:
        return {"passed": False, "description": f"source topic {evidence.app.source} does not exist."}
    problem = check.mismatches.get(TopicAspect.PARTITIONS)
    return {
        "passed": problem is None,
        "metadata": {"changelog_partitions": check.found_partitions or 0, "source_partitions": check.spec.partitions},
        "description": problem,
    }


def _cleanup_policy(evidence: _Evidence) -> Verdict:
    check = evidence.planned
    if check.status is TopicStatus.MISSING:
        return {"passed": False, "description": f"{evidence.topic} does not exist: run the provision job."}
    problem = check.mismatches.get(TopicAspect.CLEANUP_POLICY)
    return {
        "passed": problem is None,
        "metadata": {
            "cleanup.policy": check.found_config.get("cleanup.policy", "delete"),
            "expected": check.spec.config.get("cleanup.policy", "compact"),
        },
        "description": problem,
    }


def _stored_offsets(evidence: _Evidence) -> Verdict:
    beyond = {
        d.partition: (d.local_changelog_offset, d.changelog_high)
        for d in evidence.partitions
        if d.local_changelog_offset is not None and d.local_changelog_offset > d.changelog_high
    }
    return {
        "passed": not beyond,
        "metadata": {"partitions_beyond_end": len(beyond)},
        "description": None
        if not beyond
        else f"partitions {sorted(beyond)} of {evidence.topic}: local offsets beyond the end ({beyond}); the "
        "changelog was recreated. Clear those partitions' local state or restore them from a snapshot.",
    }


def _committed_retained(evidence: _Evidence) -> Verdict:
    """Every topic the app consumes still holds the messages past the group's committed offsets."""
    app = evidence.app
    gaps, partitions_with_gap = [], 0
    for topic in app.config.input_topics:
        partitions = range(app.kafka.partition_count(topic) or 0)
        committed = app.kafka.committed_offsets(app.consumer_group, topic, partitions)
        marks = app.kafka.watermarks(topic, partitions)
        lost = {p: (c, marks[p][0]) for p, c in committed.items() if c is not None and c < marks[p][0]}
        if lost:
            partitions_with_gap += len(lost)
            gaps.append(f"{topic} partitions {sorted(lost)}: committed offset below the low watermark {lost}")
    return {
        "passed": not gaps,
        "severity": AssetCheckSeverity.ERROR,
        "metadata": {"partitions_with_gap": partitions_with_gap},
        "description": None
        if not gaps
        else "; ".join(gaps) + "; messages were deleted before processing. Reset the group's offsets to the "
        "earliest to accept the gap.",
    }


def freshness_check_spec(
    app: App, store: str, max_changelog_lag: int, translator: StatefulTranslator = DEFAULT_TRANSLATOR
) -> AssetCheckSpec:
    """The store's own check, evaluated by every worker run that materializes the store (see
    `worker_runs`), so the store's page always shows the status of its latest materialization."""
    return AssetCheckSpec(
        FRESHNESS_CHECK,
        asset=store_key(app, store, translator),
        description=f"Local state is at most {max_changelog_lag} changelog records behind (every partition on "
        "this machine, evaluated by each worker run).",
    )


TABLE_POSITION_CHECK = "table_position_valid"


def table_check_spec(app: App, table: str, translator: StatefulTranslator = DEFAULT_TRANSLATOR) -> AssetCheckSpec:
    """A partitioned table's check, evaluated by every worker run that materializes it."""
    return AssetCheckSpec(
        TABLE_POSITION_CHECK,
        asset=table_store_key(app, table, translator),
        description="The position the last commit applied the table to lies within its topic (past the end: "
        "the topic was recreated, and workers read the table again from its beginning).",
    )


def table_verdict(descriptions: list[TablePartitionDescription]) -> Verdict:
    """The table check's verdict on the table's partitions (`TABLE_POSITION_CHECK`'s result but for the key)."""
    invalid = {d.partition: d.committed_position for d in descriptions if not d.position_valid}
    return {
        "passed": not invalid,
        "severity": AssetCheckSeverity.ERROR,
        "metadata": {
            "partitions_past_the_end": len(invalid),
            "records_not_applied": sum(d.records_not_applied for d in descriptions),
        },
        "description": None
        if not invalid
        else f"partitions {sorted(invalid)} recorded positions {invalid} past the end of "
        f"{descriptions[0].topic}: the topic was recreated or truncated. Workers read the table again from its "
        "beginning; check that the table's producers wrote it again in full.",
    }


def freshness_verdict(bound: App, store: str, max_changelog_lag: int) -> Verdict:
    """The freshness check's verdict on the local partitions of `store` (`FRESHNESS_CHECK`'s result
    but for the asset's key)."""
    lags = {d.partition: d.changelog_lag for d in bound.describe_partitions(stores=[store])}
    behind = {partition: lag for partition, lag in lags.items() if lag > max_changelog_lag}
    return {
        "passed": not behind,
        "severity": AssetCheckSeverity.WARN,
        "metadata": {
            "partitions_behind": len(behind),
            "largest_changelog_lag": max(lags.values(), default=0),
            "changelog_lag_limit": max_changelog_lag,
        },
        "description": None
        if not behind
        else f"partitions {sorted(behind)} are behind their changelog by {behind} records: run the restore job for "
        "them (the rebalance sensor requests it).",
    }


def _matches_replay(evidence: _Evidence) -> Verdict:
    app, store = evidence.app, evidence.store
    compared, differing, skipped = [], {}, []
    for description in evidence.partitions:
        partition = description.partition
        up_to_date = description.local_changelog_offset is not None and not description.changelog_lag
        local = _local_digest(app, store, partition) if up_to_date else None
        if local is None:
            skipped.append(partition)
            continue
        replayed = app.replay_digest(store, partition)
        compared.append(partition)
        if local != replayed:
            differing[partition] = {
                "local": f"{local.keys} keys {local.sha256[:12]}",
                "replay": f"{replayed.keys} keys {replayed.sha256[:12]}",
            }
    return {
        "passed": not differing,
        "metadata": {
            "partitions_compared": len(compared),
            "partitions_skipped": len(skipped),
            "differing": MetadataValue.json({str(p): digests for p, digests in differing.items()}),
        },
        "description": None
        if not differing
        else f"partitions {sorted(differing)} differ from a changelog replay: clear them and restore from the "
        "changelog (restore job with from_scratch and method changelog).",
    }


def _local_digest(app: App, store: str, partition: int) -> Digest | None:
    part = app.state.partition(store, partition)
    try:
        part.open()
    except StateLockedError:
        return None  # a running worker holds it
    try:
        # An in-memory store has nothing outside its worker's process.
        return partition_digest(part) if part.has_local_state else None
    finally:
        part.close()


def _snapshot_fresh(evidence: _Evidence) -> Verdict:
    root = evidence.snapshot_root
    latest = SnapshotStore(root, evidence.app.name, evidence.store).latest() if root else None
    return _fresh(root, latest, evidence.max_snapshot_age_hours)


def _table_snapshot_checks(
    app: App, max_age_hours: float, translator: StatefulTranslator, automation: AutomationCondition | None
) -> AssetChecksDefinition:
    """The `snapshot_fresh` check of each partitioned table's snapshot asset, as a store snapshot's."""
    keys = {
        table: AssetCheckKey(table_snapshot_key(app, table, translator), SNAPSHOT_FRESH)
        for table in snapshot_tables(app)
    }
    specs = [
        AssetCheckSpec(
            SNAPSHOT_FRESH,
            asset=key.asset_key,
            description=f"The latest snapshot of table `{table}` is younger than {max_age_hours:g} hours.",
            automation_condition=automation,
        )
        for table, key in keys.items()
    ]

    @multi_asset_check(
        name=job_name(app, "table_snapshot_checks"),
        specs=specs,
        can_subset=True,
        description="The checks of the partitioned tables' snapshots.",
    )
    def table_snapshot_checks(
        context: AssetCheckExecutionContext, state_store: StateStoreResource
    ) -> Iterator[AssetCheckResult]:
        root = state_store.snapshot_root
        for table, key in keys.items():
            if key in context.selected_asset_check_keys:
                latest = table_snapshots(root, app.name, table).latest() if root else None
                yield AssetCheckResult(
                    asset_key=key.asset_key, check_name=key.name, **_fresh(root, latest, max_age_hours)
                )

    return table_snapshot_checks


def _fresh(root: str | None, latest: SnapshotManifest | None, max_age_hours: float) -> Verdict:
    """The `snapshot_fresh` verdict on the latest snapshot of a store or a table."""
    if not root:
        return {"passed": True, "description": "snapshots are not configured (no snapshot_root)"}
    if latest is None:
        return {
            "passed": False,
            "severity": AssetCheckSeverity.WARN,
            "description": "no snapshot yet: materialize the snapshot asset",
        }
    age_hours = latest.age_seconds / 3600
    fresh = age_hours <= max_age_hours
    return {
        "passed": fresh,
        "severity": AssetCheckSeverity.WARN,
        "metadata": {"snapshot_id": latest.snapshot_id, "age_hours": round(age_hours, 2)},
        "description": None
        if fresh
        else f"snapshot {latest.snapshot_id} is {age_hours:.1f} h old: is the compaction schedule running?",
    }
