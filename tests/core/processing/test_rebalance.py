"""Two workers of one app share the partitions and hand them over correctly when one joins or leaves."""

from __future__ import annotations

import threading
import time

from support.core_helpers import expected_totals, make_orders, orders_topic, totals_app, totals_in_store
from support.kafka_helpers import produce, wait_for

from dagster_stateful.core import AppState, State, WorkerReport
from dagster_stateful.core.processing.worker.loop import Worker


def slow_total(order: dict, state: State) -> dict:
    time.sleep(0.003)
    state.set("total", state.get("total", 0) + order["amount"])
    return order


def slow_app(bootstrap, source, state_dir, name):
    return totals_app(bootstrap, source, state_dir, name, step=slow_total)


def test_two_workers_split_partitions_and_survive_join_and_leave(kafka_bootstrap, unique_name, tmp_path):
    # A takes 3 s per consumed batch of 1,000 and gives partitions away only when it consumes again:
    # 6,000 orders (1,400 or more per partition) leave work in a partition it gives B, whichever it gives.
    orders = make_orders(6000, customers=30)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 4, orders)
    name = unique_name("totals")
    app_a = slow_app(kafka_bootstrap, source, tmp_path / "a", name)
    app_b = slow_app(kafka_bootstrap, source, tmp_path / "b", name)
    worker_a = app_a.worker(max_seconds=180)
    worker_b = app_b.worker(max_seconds=180)
    results: dict[str, WorkerReport | BaseException] = {}

    def run(label: str, worker: Worker) -> None:
        try:
            results[label] = worker.run()
        except BaseException as error:  # noqa: BLE001 - surfaced by the assertions below
            results[label] = error

    thread_a = threading.Thread(target=run, args=("a", worker_a))
    thread_a.start()
    wait_for(lambda: worker_a.report.total_processed >= 200, 60, "worker A to get going")
    thread_b = threading.Thread(target=run, args=("b", worker_b))
    thread_b.start()  # B joins mid-run: a rebalance moves partitions from A to B
    thread_a.join(200)
    thread_b.join(200)

    report_a, report_b = results["a"], results["b"]
    assert not isinstance(report_a, BaseException), report_a
    assert not isinstance(report_b, BaseException), report_b
    assert report_a.rebalances >= 2, "A saw its initial assignment and the revocation when B joined"
    assert report_b.total_processed > 0, "B took over some partitions"
    assert report_a.total_processed + report_b.total_processed >= len(orders)

    # B leaves; new orders arrive; A alone takes every partition back and restores what B changed.
    more = make_orders(400, customers=30, start=6000)
    produce(kafka_bootstrap, source, more)
    states: list[AppState] = []
    final = totals_app(kafka_bootstrap, source, tmp_path / "a", name)
    final.add_state_listener(lambda new, old: states.append(new))
    report = final.run_worker(max_seconds=120)

    moved = {p for p, count in report_b.messages_processed.items() if count}
    # A caught up on B's work partially: when B left during the shared run, or in this final run.
    restored_by_a = {r.partition for r in report_a.restores + report.restores if r.kind == "partial"}
    assert moved <= restored_by_a
    assert totals_in_store(final, 4) == expected_totals(orders + more)
    assert states[:2] == [AppState.REBALANCING, AppState.RUNNING] and states[-1] == AppState.NOT_RUNNING


def test_static_membership_keeps_the_worker_named_across_restarts(kafka_bootstrap, unique_name, tmp_path):
    orders = make_orders(200, customers=10)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 2, orders)
    name = unique_name("totals")
    app = totals_app(kafka_bootstrap, source, tmp_path, name, group_instance_id="worker-a")
    worker = app.worker(max_seconds=120, until_caught_up=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        group = wait_for(
            lambda: g if (g := app.kafka.describe_group(app.consumer_group, source)).members else None,
            60,
            "the worker to join the group",
        )
        assert [member.group_instance_id for member in group.members] == ["worker-a"]
        assert sorted(p for member in group.members for p in member.partitions) == [0, 1]
        wait_for(lambda: worker.report.total_processed == 200, 60, "the backlog to be processed")
    finally:
        worker.stop.request()
        thread.join(60)

    more = make_orders(100, customers=10, start=200)
    produce(kafka_bootstrap, source, more)
    restarted = totals_app(kafka_bootstrap, source, tmp_path, name, group_instance_id="worker-a")
    report = restarted.run_worker(max_seconds=120)

    assert report.stop_reason == "caught_up" and report.total_processed == 100
    assert totals_in_store(restarted, 2) == expected_totals(orders + more)
