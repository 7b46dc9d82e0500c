"""Asset checks for what goes wrong with stateful apps in production.

Owns the checks on each changelog asset (partition count equals the source's; cleanup policy is
the store's: compact, or compact,delete for a window store; both judged by the app's provisioning
plan, the verdict the provision job and workers act on; no local stored offset beyond the
changelog's end, the sign of a recreated changelog; the group's committed source offset not below
the source's low watermark, the sign of data lost to retention; up-to-date local partitions equal
a changelog replay, by digest), on each snapshot asset (not too old) and on each state-store asset
(local state not too far behind its changelog: evaluated by the store's own materialization, so
every worker run carries its result). Each result says what it found, where, and what to do.
With a cron, an automation-condition sensor (`checks_sensor`) evaluates them on that schedule and
after each materialization of the asset they check.
"""

from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    AssetSelection,
    AutomationCondition,
    AutomationConditionSensorDefinition,
    DefaultSensorStatus,
    MetadataValue,
    asset_check,
)

from dagster_stateful.core.app import App
from dagster_stateful.core.kafka.provisioning import TopicAspect, TopicCheck, TopicStatus
from dagster_stateful.core.recovery.snapshots import SnapshotStore
from dagster_stateful.core.recovery.verification import Digest, partition_digest
from dagster_stateful.errors import StateLockedError
from dagster_stateful.naming import changelog_key, job_name, snapshot_key, store_key
from dagster_stateful.resources import KafkaResource, StateStoreResource
from dagster_stateful.translator import DEFAULT_TRANSLATOR, StatefulTranslator

Condition = AutomationCondition | None
FRESHNESS_CHECK = "local_state_fresh"


def stateful_checks(
    app: App,
    max_snapshot_age_hours: float = 48.0,
    translator: StatefulTranslator = DEFAULT_TRANSLATOR,
    check_cron: str | None = None,
) -> list:
    """The checks of the changelogs and snapshots of every store of `app`; with `check_cron`, each is
    evaluated on that schedule and after each materialization of its asset by a Dagster
    automation-condition sensor (see `checks_sensor`), so it never stays "Not evaluated". The
    store's own check is part of the store asset (`freshness_check_spec`)."""
    automation = _automation(check_cron)
    checks = []
    for store in app.stores:
        if app.config.use_changelog_topics:
            checks += _changelog_checks(app, store, translator, automation)
            checks.append(_replay_verification_check(app, store, translator, automation))
            checks.append(_snapshot_age_check(app, store, max_snapshot_age_hours, translator, automation))
    return checks


def _automation(check_cron: str | None) -> AutomationCondition | None:
    """At each tick of `check_cron` and after each materialization of the checked asset (which
    would otherwise leave its checks "Not evaluated"), unless the check is running already."""
    if check_cron is None:
        return None
    due = AutomationCondition.cron_tick_passed(check_cron) | AutomationCondition.any_deps_updated()
    return due & ~AutomationCondition.in_progress()


def checks_sensor(app: App, checks: list, default_status: DefaultSensorStatus) -> AutomationConditionSensorDefinition:
    """The sensor that evaluates the automation conditions of `app`'s checks (and launches them)."""
    return AutomationConditionSensorDefinition(
        job_name(app, "checks_sensor"),
        target=AssetSelection.checks(*checks),
        default_status=default_status,
        description=f"Evaluates the checks of app `{app.name}` on their schedule.",
    )


def _changelog_checks(app: App, store: str, translator: StatefulTranslator, automation: Condition) -> list:
    topic = app.changelog_topic(store)
    key = changelog_key(app, store, translator)

    @asset_check(
        asset=key,
        name="partition_parity",
        description="The changelog has as many partitions as the source topic.",
        automation_condition=automation,
    )
    def partition_parity(kafka: KafkaResource, state_store: StateStoreResource) -> AssetCheckResult:
        check = _planned(state_store.bind(app, kafka), topic)
        if check.status is TopicStatus.MISSING:
            return AssetCheckResult(passed=False, description=f"{topic} does not exist: run the provision job.")
        if check.spec.partitions is None:
            return AssetCheckResult(passed=False, description=f"source topic {app.source} does not exist.")
        problem = check.mismatches.get(TopicAspect.PARTITIONS)
        return AssetCheckResult(
            passed=problem is None,
            metadata={
                "changelog_partitions": check.found_partitions or 0,
                "source_partitions": check.spec.partitions or 0,
            },
            description=problem,
        )

    @asset_check(
        asset=key,
        name="cleanup_policy_compact",
        description="The changelog is compacted (and, for a window store, deleted past the store's retention only).",
        automation_condition=automation,
    )
    def cleanup_policy(kafka: KafkaResource, state_store: StateStoreResource) -> AssetCheckResult:
        check = _planned(state_store.bind(app, kafka), topic)
        if check.status is TopicStatus.MISSING:
            return AssetCheckResult(passed=False, description=f"{topic} does not exist: run the provision job.")
        problem = check.mismatches.get(TopicAspect.CLEANUP_POLICY)
        return AssetCheckResult(
            passed=problem is None,
            metadata={
                "cleanup.policy": check.found_config.get("cleanup.policy", "delete"),
                "expected": check.spec.config.get("cleanup.policy", "compact"),
            },
            description=problem,
        )

    @asset_check(
        asset=key,
        name="stored_offsets_within_changelog",
        description="No local store claims a changelog offset beyond the changelog's end (a recreated changelog).",
        automation_condition=automation,
    )
    def stored_offsets(kafka: KafkaResource, state_store: StateStoreResource) -> AssetCheckResult:
        bound = state_store.bind(app, kafka)
        beyond = {
            d.partition: (d.local_changelog_offset, d.changelog_high)
            for d in bound.describe_partitions(stores=[store])
            if d.local_changelog_offset is not None and d.local_changelog_offset > d.changelog_high
        }
        return AssetCheckResult(
            passed=not beyond,
            metadata={"partitions_beyond_end": len(beyond)},
            description=None
            if not beyond
            else f"partitions {sorted(beyond)} of {topic}: local offsets beyond the end ({beyond}); the changelog was "
            "recreated. Clear those partitions' local state or restore them from a snapshot.",
        )

    @asset_check(
        asset=key,
        name="committed_offsets_retained",
        description="The group's committed source offsets are not below the source's low watermark.",
        automation_condition=automation,
    )
    def committed_retained(kafka: KafkaResource, state_store: StateStoreResource) -> AssetCheckResult:
        bound = state_store.bind(app, kafka)
        partitions = range(bound.kafka.partition_count(app.source) or 0)
        committed = bound.kafka.committed_offsets(app.consumer_group, app.source, partitions)
        marks = bound.kafka.watermarks(app.source, partitions)
        lost = {p: (c, marks[p][0]) for p, c in committed.items() if c is not None and c < marks[p][0]}
        return AssetCheckResult(
            passed=not lost,
            severity=AssetCheckSeverity.ERROR,
            metadata={"partitions_with_gap": len(lost)},
            description=None
            if not lost
            else f"{app.source} partitions {sorted(lost)}: committed offset below the low watermark {lost}; messages "
            "were deleted before processing. Reset the group's offsets to the earliest to accept the gap.",
        )

    return [partition_parity, cleanup_policy, stored_offsets, committed_retained]


def _planned(bound: App, topic: str) -> TopicCheck:
    """The provisioning plan's verdict on `topic`: the checks judge a changelog as provisioning does."""
    return bound.provisioning_plan().check(topic)


def freshness_check_spec(
    app: App, store: str, max_changelog_lag: int, translator: StatefulTranslator = DEFAULT_TRANSLATOR
) -> AssetCheckSpec:
    """The store's own check, evaluated by every materialization of the store (`freshness_result`), so
    the store's page always shows the status of its latest materialization."""
    return AssetCheckSpec(
        FRESHNESS_CHECK,
        asset=store_key(app, store, translator),
        description=f"Local state is at most {max_changelog_lag} changelog records behind (every partition on "
        "this machine, evaluated by each worker run).",
    )


def freshness_result(bound: App, store: str, max_changelog_lag: int, key: AssetKey) -> AssetCheckResult:
    """The freshness check's verdict on the local partitions of `store`, for the store asset `key`."""
    return AssetCheckResult(asset_key=key, check_name=FRESHNESS_CHECK, **_freshness(bound, store, max_changelog_lag))


def freshness_evaluation(bound: App, store: str, max_changelog_lag: int, key: AssetKey) -> AssetCheckEvaluation:
    """`freshness_result` as an event an op logs (the worker job's, which materializes the store too)."""
    return AssetCheckEvaluation(
        asset_key=key, check_name=FRESHNESS_CHECK, **_freshness(bound, store, max_changelog_lag)
    )


def _freshness(bound: App, store: str, max_changelog_lag: int) -> dict[str, Any]:
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


def _replay_verification_check(app: App, store: str, translator: StatefulTranslator, automation: Condition):
    # On the changelog, not the store: it runs on its own schedule, and a check of the store not
    # evaluated by the store's own materialization would show "not evaluated" after every worker run.
    @asset_check(
        asset=changelog_key(app, store, translator),
        name="matches_changelog_replay",
        description=f"Each local partition of store `{store}` that is up to date (a bulk restore, say) has the same "
        "content as the store a replay of this changelog gives (SHA-256 digests).",
        automation_condition=automation,
    )
    def matches_changelog_replay(kafka: KafkaResource, state_store: StateStoreResource) -> AssetCheckResult:
        bound = state_store.bind(app, kafka)
        compared, differing, skipped = [], {}, []
        for description in bound.describe_partitions(stores=[store]):
            partition = description.partition
            if description.local_changelog_offset is None or description.changelog_lag:
                skipped.append(partition)
                continue
            local = _local_digest(bound, store, partition)
            if local is None:
                skipped.append(partition)
                continue
            replayed = bound.replay_digest(store, partition)
            compared.append(partition)
            if local != replayed:
                differing[partition] = {
                    "local": f"{local.keys} keys {local.sha256[:12]}",
                    "replay": f"{replayed.keys} keys {replayed.sha256[:12]}",
                }
        return AssetCheckResult(
            passed=not differing,
            metadata={
                "partitions_compared": len(compared),
                "partitions_skipped": len(skipped),
                "differing": MetadataValue.json({str(p): digests for p, digests in differing.items()}),
            },
            description=None
            if not differing
            else f"partitions {sorted(differing)} differ from a changelog replay: clear them and restore from the "
            "changelog (restore job with from_scratch and method changelog).",
        )

    return matches_changelog_replay


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


def _snapshot_age_check(
    app: App, store: str, max_age_hours: float, translator: StatefulTranslator, automation: Condition
):
    @asset_check(
        asset=snapshot_key(app, store, translator),
        name="snapshot_fresh",
        description=f"The latest snapshot is younger than {max_age_hours:g} hours.",
        automation_condition=automation,
    )
    def snapshot_fresh(state_store: StateStoreResource) -> AssetCheckResult:
        if not state_store.snapshot_root:
            return AssetCheckResult(passed=True, description="snapshots are not configured (no snapshot_root)")
        latest = SnapshotStore(state_store.snapshot_root, app.name, store).latest()
        if latest is None:
            return AssetCheckResult(
                passed=False,
                severity=AssetCheckSeverity.WARN,
                description="no snapshot yet: materialize the snapshot asset",
            )
        age_hours = latest.age_seconds / 3600
        return AssetCheckResult(
            passed=age_hours <= max_age_hours,
            severity=AssetCheckSeverity.WARN,
            metadata={"snapshot_id": latest.snapshot_id, "age_hours": round(age_hours, 2)},
            description=None
            if age_hours <= max_age_hours
            else f"snapshot {latest.snapshot_id} is {age_hours:.1f} h old: is the compaction schedule running?",
        )

    return snapshot_fresh
