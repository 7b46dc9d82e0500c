"""The Dagster layer against the real broker: assets, checks and jobs materialize with the metadata a
user looks at."""

from collections.abc import Mapping
from typing import Any

import pytest
from dagster import AssetKey, AssetSelection, DagsterInstance, materialize
from support.core_helpers import expected_totals, make_orders, orders_topic, totals_app, totals_in_store
from support.kafka_helpers import produce

from dagster_stateful.builder import build_stateful_definitions
from dagster_stateful.checks import stateful_checks
from dagster_stateful.naming import changelog_key, job_name, store_key
from dagster_stateful.resources import KafkaResource, StateStoreResource

PARTITIONS = 3
CHECK_EVALUATION = "ASSET_CHECK_EVALUATION"


@pytest.fixture
def deployment(kafka_bootstrap, unique_name, tmp_path):
    orders = make_orders(300, customers=12)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), PARTITIONS, orders)
    app = totals_app(kafka_bootstrap, source, tmp_path, unique_name("totals")).bind(state_dir=tmp_path / "unbound")
    kafka = KafkaResource(bootstrap_servers=kafka_bootstrap)
    state_store = StateStoreResource(state_dir=str(tmp_path / "state"))
    resources = {"kafka": kafka, "state_store": state_store}
    defs = build_stateful_definitions(app, PARTITIONS, kafka, state_store)
    bound = state_store.bind(app, kafka)
    return defs, app, bound, resources, orders


def asset_def(defs, key: AssetKey):
    return defs.get_assets_def(key)


def materializations(result) -> list:
    return [e.event_specific_data.materialization for e in result.all_events if e.is_step_materialization]


def stored(result, app) -> list:
    """The store's materializations in a run (a worker run may record its changelog's first one too)."""
    return [m for m in materializations(result) if m.asset_key == store_key(app, "totals")]


def json_object(value: object) -> Mapping[str, Any]:
    """The value of a JSON metadata entry that holds an object."""
    assert isinstance(value, Mapping), value
    return value


def integer(value: object) -> int:
    """The value of an integer metadata entry."""
    assert isinstance(value, int), value
    return value


def test_changelog_asset_provisions_a_compacted_topic_and_observes_one_already_there(deployment):
    defs, app, bound, resources, _ = deployment
    instance = DagsterInstance.ephemeral()

    result = materialize([asset_def(defs, changelog_key(app, "totals"))], resources=resources, instance=instance)

    metadata = result.asset_materializations_for_node(job_name(app, "changelogs"))[0].metadata
    assert metadata["status"].value == "created"
    assert metadata["partitions"].value == PARTITIONS
    assert json_object(metadata["config"].value)["cleanup.policy"] == "compact"
    assert bound.kafka.topic_config(app.changelog_topic("totals"))["cleanup.policy"] == "compact"
    again = materialize([asset_def(defs, changelog_key(app, "totals"))], resources=resources, instance=instance)
    assert again.asset_materializations_for_node(job_name(app, "changelogs")) == [], (
        "provisioning that changed nothing records no new materialization (the stores would show as unsynced)"
    )
    [observed] = [e.asset_observation_data.asset_observation for e in again.all_events if e.is_asset_observation]
    assert observed.metadata["status"].value == "ok" and observed.metadata["partitions"].value == PARTITIONS


def test_state_store_asset_runs_a_worker_over_all_partitions(deployment):
    defs, app, bound, resources, orders = deployment

    result = materialize(
        [asset_def(defs, store_key(app, "totals"))],
        resources=resources,
        tags={"dagster/asset_partition_range_start": "0", "dagster/asset_partition_range_end": str(PARTITIONS - 1)},
    )

    metadata = stored(result, app)[0].metadata
    assert metadata["messages_processed"].value == len(orders)
    assert metadata["lag_left"].value == 0 and metadata["stop_reason"].value == "caught_up"
    assert metadata["processing_guarantee"].value == "at-least-once"
    assert metadata["keys"].value == 12 and metadata["keys_exact"].value is True, "counted, not estimated"
    assert integer(metadata["bytes_on_disk"].value) > 0
    assert sum(json_object(metadata["committed_offsets"].value).values()) == len(orders)
    assert totals_in_store(bound, PARTITIONS) == expected_totals(orders)
    assert metadata["store.get_count"].value == metadata["store.put_count"].value == len(orders), "a get and a set each"
    assert 0 < metadata["store.get_p99_ms"].value < 1_000 and 0 <= metadata["store.cache_hit_ratio"].value < 1
    assert metadata["store.rocksdb_bytes_written"].value > 0 and metadata["commits"].value >= 1
    sample = metadata["state_sample"].value
    assert isinstance(sample, list) and len(sample) == 5, "a sample of the store's state"
    assert all(row["value"] == expected_totals(orders)[row["key"]] and row["state_key"] == "total" for row in sample)
    idle = materialize(
        [asset_def(defs, store_key(app, "totals"))],
        resources=resources,
        tags={"dagster/asset_partition_range_start": "0", "dagster/asset_partition_range_end": str(PARTITIONS - 1)},
    )
    assert idle.success and stored(idle, app) == [], "nothing to do"


def test_one_partition_of_the_state_store_can_be_materialized_alone(deployment):
    defs, app, bound, resources, _orders = deployment

    result = materialize([asset_def(defs, store_key(app, "totals"))], resources=resources, partition_key="1")

    metadata = stored(result, app)[0].metadata
    assert set(json_object(metadata["messages_per_partition"].value)) == {"1"}
    assert set(json_object(metadata["keys_per_partition"].value)) == {"1"}
    committed = bound.kafka.committed_offsets(app.consumer_group, app.source, range(PARTITIONS))
    assert committed[0] is None and committed[2] is None and committed[1] > 0


def test_worker_job_records_each_partition_and_checks_pass(deployment):
    defs, app, _bound, resources, orders = deployment
    instance = DagsterInstance.ephemeral()

    result = defs.resolve_job_def(job_name(app, "worker")).execute_in_process(
        instance=instance, run_config={"ops": {job_name(app, "run_worker_op"): {"config": {"max_seconds": 120}}}}
    )

    assert result.success
    events = [m for m in materializations(result) if m.asset_key == store_key(app, "totals")]
    assert sorted(m.partition for m in events) == [str(p) for p in range(PARTITIONS)]
    changelog = instance.get_latest_materialization_event(changelog_key(app, "totals"))
    assert changelog is not None, "the changelog the worker provisioned is recorded, not 'never materialized'"
    recorded = changelog.asset_materialization
    assert recorded is not None and recorded.metadata["records_upper_bound"].value == 12, "its size: one per key"
    idle = defs.resolve_job_def(job_name(app, "worker")).execute_in_process(
        instance=instance, run_config={"ops": {job_name(app, "run_worker_op"): {"config": {"max_seconds": 120}}}}
    )
    assert idle.success and not [e for e in idle.all_events if e.is_step_materialization], "nothing to do: no record"
    assert sum(m.metadata["messages_processed"].value for m in events) == len(orders)
    assert sum(m.metadata["store.get_count"].value for m in events) == len(orders), "each partition's own gets"
    assert all(m.metadata["commits"].value >= 1 for m in events)
    assert all(m.metadata["changelog_lag"].value == 0 for m in events)
    [fresh] = [
        e.asset_check_evaluation_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"
    ]
    assert fresh.check_name == "local_state_fresh" and fresh.passed, "the run carries the store's check"
    samples = [row for m in events for row in m.metadata["state_sample"].value]
    assert {row["partition"] for row in samples} == set(range(PARTITIONS)), "each partition's own sample"
    assert all(row["value"] == expected_totals(orders)[row["key"]] for row in samples)
    [store_checks] = stateful_checks(app)
    changelog_checks = [k for k in store_checks.check_keys if k.asset_key == changelog_key(app, "totals")]
    checked = materialize(
        [asset_def(defs, changelog_key(app, "totals")), store_checks],
        selection=AssetSelection.checks(*changelog_checks),
        resources=resources,
        instance=instance,
    )
    check_results = checked.get_asset_check_evaluations()
    assert len([e for e in checked.all_events if e.is_step_start]) == 1, "the store's checks run as one step"
    assert {c.check_name: c.passed for c in check_results} == {
        "partition_parity": True,
        "cleanup_policy_compact": True,
        "stored_offsets_within_changelog": True,
        "committed_offsets_retained": True,
        "matches_changelog_replay": True,
    }


def test_restore_and_clear_state_jobs(deployment):
    defs, app, bound, _resources, orders = deployment
    bound.run_worker(max_seconds=120)
    instance = DagsterInstance.ephemeral()
    clear = defs.resolve_job_def(job_name(app, "clear_state"))

    refused = clear.execute_in_process(
        instance=instance,
        raise_on_error=False,
        run_config={"ops": {job_name(app, "clear_state_op"): {"config": {"partitions": [2]}}}},
    )
    assert not refused.success and (bound.state_dir / app.name / "totals" / "2").exists()

    cleared = clear.execute_in_process(
        instance=instance,
        run_config={"ops": {job_name(app, "clear_state_op"): {"config": {"partitions": [2], "confirm": True}}}},
    )
    assert cleared.success and not (bound.state_dir / app.name / "totals" / "2").exists()

    restored = defs.resolve_job_def(job_name(app, "restore")).execute_in_process(
        instance=instance, run_config={"ops": {job_name(app, "restore_op"): {"config": {"partitions": [2]}}}}
    )
    assert restored.success
    [event] = [e.event_specific_data.materialization for e in restored.all_events if e.is_step_materialization]
    assert event.partition == "2" and event.metadata["changelog_lag"].value == 0
    assert event.metadata["records_restored"].value > 0
    assert totals_in_store(bound, PARTITIONS) == expected_totals(orders)
    messages = [entry.user_message for entry in instance.all_logs(restored.run_id)]
    assert any(message.startswith("Restoring store 'totals' partition 2: changelog offsets") for message in messages)
    assert any(message.startswith("Restored store 'totals' partition 2:") for message in messages), messages


def test_query_state_job_shows_a_keys_state_or_every_keys(deployment):
    defs, app, bound, _resources, orders = deployment
    bound.run_worker(max_seconds=120)
    query = defs.resolve_job_def(job_name(app, "query_state"))

    def rows(**config) -> tuple[bool, list]:
        result = query.execute_in_process(
            instance=DagsterInstance.ephemeral(),
            raise_on_error=False,
            run_config={"ops": {job_name(app, "query_state_op"): {"config": config}}},
        )
        if not result.success:
            return False, []
        [materialized] = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
        return True, materialized.event_specific_data.metadata["state"].value

    totals = expected_totals(orders)
    ok, one = rows(store="totals", key="c3")
    assert ok and [(row["key"], row["state_key"], row["value"]) for row in one] == [("c3", "total", totals["c3"])]
    ok, every = rows(store="totals")
    assert ok and {row["key"]: row["value"] for row in every} == totals
    ok, limited = rows(store="totals", limit=4, partitions=[0])
    assert ok and len(limited) == 4 and {row["partition"] for row in limited} == {0}
    assert rows(store="totals", key="nobody") == (True, [])
    assert rows(store="nope") == (False, [])


def test_changelog_checks_fail_with_what_to_do(deployment):
    _defs, app, bound, resources, _orders = deployment
    bound.kafka.create_topic(app.changelog_topic("totals"), PARTITIONS + 1, 1, {"cleanup.policy": "delete"})
    parity = _evaluate(app, "partition_parity", resources)
    policy = _evaluate(app, "cleanup_policy_compact", resources)

    assert not parity.passed and f"has {PARTITIONS + 1} partitions" in parity.description
    assert not policy.passed and "cleanup.policy=delete" in policy.description


def test_each_store_materialization_carries_its_freshness_check_which_flags_partitions_behind(deployment):
    _defs, app, bound, resources, _orders = deployment
    elsewhere = bound.bind(state_dir=bound.state_dir.parent / "elsewhere")
    bound.run_worker(max_messages=30, max_seconds=120)
    elsewhere.run_worker(max_seconds=120)  # moves the changelog on without this machine's copies
    defs = build_stateful_definitions(
        app, PARTITIONS, resources["kafka"], resources["state_store"], max_changelog_lag=0
    )

    run = materialize([asset_def(defs, store_key(app, "totals"))], resources=resources, partition_key="1")

    assert [m.partition for m in stored(run, app)] == ["1"]
    [result] = run.get_asset_check_evaluations()
    assert result.check_name == "local_state_fresh" and result.asset_key == store_key(app, "totals")
    assert not result.passed and "partitions [0, 2] are behind their changelog" in (result.description or "")
    assert result.metadata["partitions_behind"].value == 2, "partition 1 was restored by the run"
    largest = max(d.changelog_lag for d in bound.describe_partitions(stores=["totals"]))
    assert result.metadata["largest_changelog_lag"].value == largest > 0, "what was measured"
    assert result.metadata["changelog_lag_limit"].value == 0, "the limit, apart from what was measured"


def _evaluate(app, check_name, resources):
    """One of the app's store checks, run alone."""
    [store_checks] = stateful_checks(app)
    [key] = [key for key in store_checks.check_keys if key.name == check_name]
    result = materialize([store_checks], resources=resources, selection=AssetSelection.checks(key))
    [evaluation] = result.get_asset_check_evaluations()
    return evaluation


def test_worker_schedule_waits_for_the_source_topic_and_for_the_run_in_progress(kafka_bootstrap, unique_name, tmp_path):
    from dagster import DagsterRunStatus, RunRequest, SkipReason, build_schedule_context

    app = totals_app(kafka_bootstrap, unique_name("not-yet"), tmp_path, unique_name("totals"))
    kafka = KafkaResource(bootstrap_servers=kafka_bootstrap)
    defs = build_stateful_definitions(app, 2, kafka, StateStoreResource(state_dir=str(tmp_path)), pool_size=2)
    schedule = defs.resolve_schedule_def(job_name(app, "worker_schedule"))
    (tmp_path / "dagster").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "dagster"))

    def evaluate():
        with build_schedule_context(instance=instance, resources={"kafka": kafka}) as context:
            return schedule(context)

    skipped = evaluate()
    assert isinstance(skipped, SkipReason) and skipped.skip_message is not None, skipped
    assert "does not exist yet" in skipped.skip_message

    bound_app = app.bind(kafka=kafka.clients())
    bound_app.kafka.create_topic(app.source, 2, 1, {})
    idle = evaluate()
    assert isinstance(idle, SkipReason) and "no lag" in str(idle.skip_message), "an empty topic: nothing to do"

    produce(kafka_bootstrap, app.source, make_orders(3, customers=3))
    requested = evaluate()
    assert isinstance(requested, RunRequest), "once the topic holds messages, the schedule runs the worker"
    assert requested.tags["dagster-stateful/lag"] == "3"

    worker = defs.resolve_job_def(job_name(app, "worker"))
    instance.create_run_for_job(worker, status=DagsterRunStatus.STARTED)
    busy = evaluate()
    assert isinstance(busy, SkipReason) and "still in progress" in str(busy.skip_message), "a pool never overlaps"


def test_store_assets_say_what_each_store_is_and_apps_share_their_source(tmp_path):
    from dagster_stateful.core import App, Count, Store

    kafka = KafkaResource(bootstrap_servers="127.0.0.1:1")
    counts = App(
        "counts",
        "orders",
        stores=[Store("seen", ttl=60_000), "per_minute", Store("recent", kind="lru", max_entries=100)],
        kafka="127.0.0.1:1",
    )
    counts.dataframe().filter(lambda order, seen: True, store="seen").update(
        lambda order, recent: None, store="recent"
    ).tumbling_window(60_000, grace=5_000, store="per_minute").aggregate(Count()).final()
    totals = App("totals", "orders", kafka="127.0.0.1:1")

    defs = build_stateful_definitions([counts, totals], 2, kafka, StateStoreResource(state_dir=str(tmp_path)))

    def metadata(app, store: str) -> dict:
        key = store_key(app, store)
        return dict(defs.get_assets_def(key).specs_by_key[key].metadata)

    assert metadata(counts, "seen") == {
        "store_kind": "rocksdb",
        "store_holds": "key-value state",
        "store_ttl_ms": 60_000,
    }
    assert metadata(counts, "recent") == {
        "store_kind": "lru",
        "store_holds": "key-value state",
        "store_max_entries": 100,
    }
    assert metadata(counts, "per_minute") == {
        "store_kind": "rocksdb",
        "store_holds": "windows",
        "store_window_size_ms": 60_000,
        "store_window_grace_ms": 5_000,
        "store_window_retention_ms": 65_000,
    }
    assert defs.resolve_job_def(job_name(totals, "query_state")) is not None
    graph = defs.resolve_asset_graph()
    assert [key for key in graph.get_all_asset_keys() if key == AssetKey(["kafka", "orders"])] == [
        AssetKey(["kafka", "orders"])
    ], "one asset for the topic both apps read"
    source = graph.get(AssetKey(["kafka", "orders"]))
    assert source.group_name == "kafka", "a shared topic sits in a group of its own, not in either app's"
    assert "`counts`" in (source.description or "") and "`totals`" in (source.description or "")
    groups = {graph.get(key).group_name for key in graph.get_all_asset_keys() if key != source.key}
    assert groups == {"counts", "totals"}
    for key in graph.get_all_asset_keys():  # no lineage from one app's assets to the other's
        parents = {graph.get(parent).group_name for parent in graph.get(key).parent_keys}
        assert parents <= {graph.get(key).group_name, "kafka"}, f"{key.to_user_string()} depends on {parents}"


def test_a_translator_chooses_the_keys_and_groups_and_every_definition_follows(tmp_path):
    from dagster import AssetKey

    from dagster_stateful import StatefulTranslator

    class Warehouse(StatefulTranslator):
        def get_store_key(self, app, store):
            return AssetKey(["streaming", app.name, store])

        def get_group_name(self, app):
            return "streaming"

    app = totals_app("127.0.0.1:1", "orders", tmp_path, "totals")
    kafka = KafkaResource(bootstrap_servers="127.0.0.1:1")
    defs = build_stateful_definitions(
        app, 2, kafka, StateStoreResource(state_dir=str(tmp_path)), translator=Warehouse()
    )

    keys = defs.resolve_asset_graph().get_all_asset_keys()
    assert AssetKey(["streaming", "totals", "totals"]) in keys
    assert AssetKey(["totals", "totals_snapshot"]) in keys, "the default for what is not overridden"
    assert AssetKey(["totals", "totals_store"]) not in keys
    store = defs.get_assets_def(AssetKey(["streaming", "totals", "totals"]))
    assert {key.asset_key for key in store.check_keys} == {AssetKey(["streaming", "totals", "totals"])}
    assert store.group_names_by_key[AssetKey(["streaming", "totals", "totals"])] == "streaming"


def test_the_checks_are_requested_at_each_tick_of_their_schedule(tmp_path):
    import datetime

    from dagster import evaluate_automation_conditions

    app = totals_app("127.0.0.1:1", "orders", tmp_path, "totals")
    kafka = KafkaResource(bootstrap_servers="127.0.0.1:1")
    state_store = StateStoreResource(state_dir=str(tmp_path))
    defs = build_stateful_definitions(app, 2, kafka, state_store, check_cron="*/10 * * * *")
    instance = DagsterInstance.ephemeral()
    start = datetime.datetime(2026, 1, 1, 0, 5, tzinfo=datetime.UTC)

    first = evaluate_automation_conditions(defs=defs, instance=instance, evaluation_time=start)
    ticked = evaluate_automation_conditions(
        defs=defs, instance=instance, cursor=first.cursor, evaluation_time=start + datetime.timedelta(minutes=6)
    )
    quiet = evaluate_automation_conditions(
        defs=defs, instance=instance, cursor=ticked.cursor, evaluation_time=start + datetime.timedelta(minutes=8)
    )

    requested = {result.key.name for result in ticked.results if result.true_subset.size}
    every_check = {key.name for check in stateful_checks(app) for key in check.check_keys}
    assert requested == every_check and len(every_check) == 6
    assert first.total_requested == 0 and quiet.total_requested == 0, "once per tick"
    assert defs.resolve_sensor_def(job_name(app, "checks_sensor")) is not None
