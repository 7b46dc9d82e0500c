"""A pool of workers of one app on one machine, against a real broker: three members over six
partitions split them two each, a member that stops hands its partitions to the others, which
restore only the changelog tail written since they last held them (the members share the state
directory) or nothing at all, and the totals are exact under exactly-once. With standby replicas on
the shared directory, a standby never keeps a store from its active owner (it hands it over when
asked)."""

from __future__ import annotations

import threading
import time

import pytest
from support.core_helpers import expected_totals, make_orders, orders_topic, totals_app, totals_in_store
from support.kafka_helpers import produce, wait_for

from dagster_stateful.core import State, WorkerReport
from dagster_stateful.core.processing.worker.loop import Worker

PARTITIONS = 6
MEMBERS = 3


def slow_total(order: dict, state: State) -> dict:
    time.sleep(0.002)
    state.set("total", state.get("total", 0) + order["amount"])
    return order


def start(worker: Worker, results: dict[int, WorkerReport | BaseException], index: int) -> threading.Thread:
    def run() -> None:
        try:
            results[index] = worker.run()
        except BaseException as error:  # noqa: BLE001 - surfaced by the assertions
            results[index] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("standbys", [0, 1])
def test_a_pool_splits_the_partitions_and_a_member_that_stops_hands_them_over_with_the_tail(
    kafka_bootstrap, unique_name, tmp_path, standbys
):
    first = make_orders(3_000, customers=60)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), PARTITIONS, first)
    app = totals_app(
        kafka_bootstrap,
        source,
        tmp_path,
        unique_name("pool"),
        step=slow_total,
        processing_guarantee="exactly-once",
        num_standby_replicas=standbys,
    )
    members = [app.pool_member(index, pool="test") for index in range(MEMBERS)]
    assert len({member.config.group_instance_id for member in members}) == MEMBERS
    workers = [member.worker(max_seconds=180, until_caught_up=False) for member in members]
    results: dict[int, WorkerReport | BaseException] = {}
    threads = [start(worker, results, index) for index, worker in enumerate(workers)]

    def owned() -> dict[str, set[int]] | None:
        """Each member's partitions (by its static member id), once the group is stable."""
        group = app.kafka.describe_group(app.consumer_group, source)
        if group.state != "STABLE":
            return None
        by_member: dict[str, set[int]] = {}
        for partition, owner in group.owners().items():
            by_member.setdefault(owner, set()).add(partition)
        return by_member

    def split_two_each() -> dict[str, set[int]] | None:
        processed = sum(w.report.total_processed for w in workers)
        split = owned() if processed >= 3_000 else None
        return split if split and len(split) == MEMBERS and all(len(p) == 2 for p in split.values()) else None

    split = wait_for(split_two_each, 120, "three members holding two partitions each, through the first orders")
    assert set().union(*split.values()) == set(range(PARTITIONS))

    workers[0].stop.request()  # member 0 leaves; its two partitions move to the others
    threads[0].join(60)
    second = make_orders(1_200, customers=60, start=3_000)
    produce(kafka_bootstrap, source, second)
    wait_for(
        lambda: sum(w.report.total_processed for w in workers[1:]) + workers[0].report.total_processed >= 4_200,
        120,
        "the other members through the second orders",
    )
    for worker, thread in zip(workers[1:], threads[1:], strict=True):
        worker.stop.request()
        thread.join(60)

    reports = [results[index] for index in range(MEMBERS)]
    assert all(isinstance(report, WorkerReport) for report in reports), reports
    taken = split[str(members[0].config.group_instance_id)]
    after = set().union(*(set(report.messages_processed) for report in reports[1:]))  # type: ignore[union-attr]
    assert taken <= after, "the other members processed member 0's partitions after it left"
    restores = [r for report in reports[1:] for r in report.restores if r.partition in taken]  # type: ignore[union-attr]
    assert all(r.kind != "full" for r in restores), "the shared state directory: at most the tail is restored"
    assert totals_in_store(app, PARTITIONS) == expected_totals(first + second), "exactly-once is exact"
