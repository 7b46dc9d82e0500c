"""Asset checks for what goes wrong with stateful apps in production.

Owns the checks on each changelog asset (partition count equals the source's; cleanup policy is
compact; no local stored offset beyond the changelog's end, the sign of a recreated changelog;
the group's committed source offset not below the source's low watermark, the sign of data lost to
retention) and on each state-store asset (local state not too far behind its changelog). Each
result says what it found, where, and what to do.
"""

from dagster import AssetCheckResult, AssetCheckSeverity, asset_check

from dagster_stateful.core.app import App
from dagster_stateful.core.maintenance import describe_partitions
from dagster_stateful.naming import changelog_key, store_key
from dagster_stateful.resources import KafkaResource, StateStoreResource


def stateful_checks(app: App, max_changelog_lag: int = 100_000) -> list:
    checks = []
    for store in app.stores:
        if app.use_changelog_topics:
            checks += _changelog_checks(app, store)
        checks.append(_state_freshness_check(app, store, max_changelog_lag))
    return checks


def _changelog_checks(app: App, store: str) -> list:
    topic = app.changelog_topic(store)
    key = changelog_key(app, store)

    @asset_check(asset=key, name="partition_parity", description="The changelog has as many partitions as the "
                                                                  "source topic.")
    def partition_parity(kafka: KafkaResource, state_store: StateStoreResource) -> AssetCheckResult:
        clients = state_store.bind(app, kafka).kafka
        found, expected = clients.partition_count(topic), clients.partition_count(app.source)
        if found is None:
            return AssetCheckResult(passed=False, description=f"{topic} does not exist: run the provision job.")
        return AssetCheckResult(
            passed=found == expected, metadata={"changelog_partitions": found, "source_partitions": expected or 0},
            description=None if found == expected else
            f"{topic} has {found} partitions, {app.source} has {expected}: recreate the changelog with {expected}.")

    @asset_check(asset=key, name="cleanup_policy_compact", description="The changelog is compacted, not deleted "
                                                                       "by retention.")
    def cleanup_policy(kafka: KafkaResource, state_store: StateStoreResource) -> AssetCheckResult:
        clients = state_store.bind(app, kafka).kafka
        if clients.partition_count(topic) is None:
            return AssetCheckResult(passed=False, description=f"{topic} does not exist: run the provision job.")
        policy = clients.topic_config(topic).get("cleanup.policy", "delete")
        return AssetCheckResult(passed=policy == "compact", metadata={"cleanup.policy": policy},
                                description=None if policy == "compact" else
                                f"{topic} has cleanup.policy={policy}; set it to compact or state will be lost.")

    @asset_check(asset=key, name="stored_offsets_within_changelog",
                 description="No local store claims a changelog offset beyond the changelog's end (a recreated "
                             "changelog).")
    def stored_offsets(kafka: KafkaResource, state_store: StateStoreResource) -> AssetCheckResult:
        bound = state_store.bind(app, kafka)
        beyond = {d.partition: (d.local_changelog_offset, d.changelog_high) for d in describe_partitions(bound, stores=[store])
                  if d.local_changelog_offset is not None and d.local_changelog_offset > d.changelog_high}
        return AssetCheckResult(
            passed=not beyond, metadata={"partitions_beyond_end": len(beyond)},
            description=None if not beyond else
            f"partitions {sorted(beyond)} of {topic}: local offsets beyond the end ({beyond}); the changelog was "
            "recreated. Clear those partitions' local state or restore them from a snapshot.")

    @asset_check(asset=key, name="committed_offsets_retained",
                 description="The group's committed source offsets are not below the source's low watermark.")
    def committed_retained(kafka: KafkaResource, state_store: StateStoreResource) -> AssetCheckResult:
        bound = state_store.bind(app, kafka)
        partitions = range(bound.kafka.partition_count(app.source) or 0)
        committed = bound.kafka.committed_offsets(app.consumer_group, app.source, partitions)
        marks = bound.kafka.watermarks(app.source, partitions)
        lost = {p: (c, marks[p][0]) for p, c in committed.items() if c is not None and c < marks[p][0]}
        return AssetCheckResult(
            passed=not lost, severity=AssetCheckSeverity.ERROR, metadata={"partitions_with_gap": len(lost)},
            description=None if not lost else
            f"{app.source} partitions {sorted(lost)}: committed offset below the low watermark {lost}; messages "
            "were deleted before processing. Reset the group's offsets to the earliest to accept the gap.")

    return [partition_parity, cleanup_policy, stored_offsets, committed_retained]


def _state_freshness_check(app: App, store: str, max_changelog_lag: int):
    @asset_check(asset=store_key(app, store), name="local_state_fresh",
                 description=f"Local state is at most {max_changelog_lag} changelog records behind.")
    def local_state_fresh(kafka: KafkaResource, state_store: StateStoreResource) -> AssetCheckResult:
        bound = state_store.bind(app, kafka)
        behind = {d.partition: d.changelog_lag for d in describe_partitions(bound, stores=[store])
                  if d.changelog_lag > max_changelog_lag}
        return AssetCheckResult(
            passed=not behind, severity=AssetCheckSeverity.WARN,
            metadata={"partitions_behind": len(behind), "max_changelog_lag": max_changelog_lag},
            description=None if not behind else
            f"partitions {sorted(behind)} are behind their changelog by {behind} records: run the restore job for "
            "them (the rebalance sensor requests it).")

    return local_state_fresh
