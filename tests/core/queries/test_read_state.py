"""Reading state from a running worker, against a real broker: while the worker holds its partitions'
locks and keeps processing, a reader sees the totals it has committed (equal to the totals
recomputed from the source once the worker has caught up), and the same after the worker stops."""

from __future__ import annotations

import threading

from support.core_helpers import expected_totals, make_orders, orders_topic, totals_app
from support.kafka_helpers import produce, wait_for

from dagster_stateful.core import StateLockedError

PARTITIONS = 3


def test_a_running_workers_committed_totals_are_read_without_its_lock(kafka_bootstrap, unique_name, tmp_path):
    first = make_orders(2_000, 40)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), PARTITIONS, first)
    app = totals_app(kafka_bootstrap, source, tmp_path, unique_name("totals"))
    worker = app.worker(max_seconds=120, until_caught_up=False)
    outcome: dict[str, object] = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("report", worker.run()), daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(app.state.local_partitions("totals")) == PARTITIONS, 60, "the worker's partitions")

        def totals_read() -> dict[str, int]:
            with app.read_state("totals") as totals:
                return {entry.message_key: entry.value for entry in totals.items()}

        wait_for(lambda: totals_read() == expected_totals(first), 60, "the first orders' totals, read while running")
        second = make_orders(1_500, 40, start=2_000)
        produce(kafka_bootstrap, source, second)
        with app.read_state("totals") as reader:

            def refreshed_total() -> int:
                reader.refresh()
                return reader.get("c7", "total")

            wanted = expected_totals(first + second)["c7"]
            wait_for(lambda: refreshed_total() == wanted, 60, "c7's total after the second orders, through refresh()")
            with_lock = app.state.partition("totals", 0)
            try:
                with_lock.open(lock_timeout=0)
                raise AssertionError("the worker should hold its partitions' locks")
            except StateLockedError:
                pass
        assert thread.is_alive(), "the worker kept running while it was read"
    finally:
        worker.stop.request()
        thread.join(60)
    assert outcome["report"].total_processed == 3_500  # type: ignore[attr-defined]

    with app.read_state("totals") as totals:
        assert {entry.message_key: entry.value for entry in totals.items()} == expected_totals(first + second)
