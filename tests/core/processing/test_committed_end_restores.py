"""A worker's commits record where its changelogs end, and its next full restore takes the records
below that end without their headers, to the same totals (real broker).

Two partitions, one restored in the worker's process and one in a child when cores allow: both take
the recorded end. After a run whose commits could not vouch for the changelog (someone else wrote
to it), the next full restore reads every header, and its own commits record ends again.
"""

from __future__ import annotations

from confluent_kafka import Producer
from support.core_helpers import add_to_total, expected_totals, make_orders, orders_topic, totals_app, totals_in_store
from support.kafka_helpers import produce

from dagster_stateful.core import App, State
from dagster_stateful.core.state.commit_metadata import CommitMetadata, decode_commit_metadata
from dagster_stateful.core.state.keys import message_prefix

PARTITIONS = 2


def committed_metadata(app: App, partitions: int = PARTITIONS) -> dict[int, CommitMetadata]:
    positions = app.kafka.committed(app.config.consumer_group, app.config.source, range(partitions))
    return {p: decode_commit_metadata(metadata, offset, "test") for p, (offset, metadata) in positions.items()}


def assert_the_changelog_ends_are_recorded(app: App, partitions: int = PARTITIONS) -> None:
    ends = app.kafka.watermarks(app.changelog_topic("totals"), list(range(partitions)))
    recorded = {p: metadata.changelog_ends for p, metadata in committed_metadata(app, partitions).items()}
    assert recorded == {p: {"totals": high} for p, (_, high) in ends.items()}


def processed_once(bootstrap: str, unique_name, tmp_path) -> tuple[App, list[tuple[bytes, bytes]]]:
    """An app whose worker processed 400 orders over two partitions, and those orders."""
    orders = make_orders(400, customers=30)
    source = orders_topic(bootstrap, unique_name("orders"), PARTITIONS, orders)
    app = totals_app(bootstrap, source, tmp_path, unique_name("totals"))
    assert app.run_worker(until_caught_up=True, max_seconds=120).stop_reason == "caught_up"
    return app, orders


def test_a_full_restore_takes_the_records_below_the_last_commits_end_to_the_same_totals(
    kafka_bootstrap, unique_name, tmp_path
):
    app, orders = processed_once(kafka_bootstrap, unique_name, tmp_path)
    assert_the_changelog_ends_are_recorded(app)

    app.clear_state()
    report = app.run_worker(until_caught_up=True, max_seconds=120)

    assert report.stop_reason == "caught_up"
    full = [r for r in report.restores if r.kind == "full"]
    assert len(full) == PARTITIONS
    assert all(r.records_below_committed_end == r.records_applied > 0 for r in full), full
    assert totals_in_store(app, PARTITIONS) == expected_totals(orders)


def test_the_restore_job_takes_the_records_below_the_last_commits_end_in_one_process_and_in_two(
    kafka_bootstrap, unique_name, tmp_path
):
    app, orders = processed_once(kafka_bootstrap, unique_name, tmp_path)

    for processes in (1, 2):
        results = app.restore_partitions(
            range(PARTITIONS), from_scratch=True, method="changelog", load_processes=processes
        )

        reports = [report for result in results for report in result.reports]
        assert len(reports) == PARTITIONS and all(r.kind == "full" for r in reports), reports
        assert all(r.records_below_committed_end == r.records_applied > 0 for r in reports), reports
        assert totals_in_store(app, PARTITIONS) == expected_totals(orders)


def test_after_a_foreign_record_the_next_restore_reads_headers_and_the_run_after_records_ends_again(
    kafka_bootstrap, unique_name, tmp_path
):
    """One partition. While the second run processes, someone else writes to its changelog (as a
    worker that lost the partition and does not know it yet would): that run's commits record no end."""
    first, second = make_orders(200, customers=20), make_orders(200, customers=20, start=200)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 1, first)
    name = unique_name("totals")
    app = totals_app(kafka_bootstrap, source, tmp_path, name)
    assert app.run_worker(until_caught_up=True, max_seconds=120).stop_reason == "caught_up"
    changelog = app.changelog_topic("totals")
    intruder = Producer({"bootstrap.servers": kafka_bootstrap})
    intruded: list[int] = []

    def add_and_intrude(order: dict, state: State) -> dict:
        if not intruded:
            intruder.produce(changelog, key=message_prefix(b"no-such-customer") + b"total", value=None, partition=0)
            intruded.append(intruder.flush(30))
        return add_to_total(order, state)

    produce(kafka_bootstrap, source, second)
    intruding = totals_app(kafka_bootstrap, source, tmp_path, name, step=add_and_intrude)
    assert intruding.run_worker(until_caught_up=True, max_seconds=120).stop_reason == "caught_up"
    assert intruded == [0], "the foreign record was written while the worker ran"
    assert committed_metadata(app, 1)[0].changelog_ends == {}

    third = make_orders(100, customers=20, start=400)
    produce(kafka_bootstrap, source, third)
    app.clear_state()
    report = app.run_worker(until_caught_up=True, max_seconds=120)
    assert [r.records_below_committed_end for r in report.restores] == [0], "the restore read every header"
    assert totals_in_store(app, 1) == expected_totals(first + second + third)
    assert_the_changelog_ends_are_recorded(app, 1)
