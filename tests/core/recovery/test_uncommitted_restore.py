"""Changelog records of uncommitted messages, with aggressive compaction, as production sees it.

A worker dies (or pauses) between delivering its changelog records and committing the source
offsets: the faulty consumer below stands in for a crash at exactly that point. Totals are always
recomputed from the source topic, never read back from the code under test.
"""

from __future__ import annotations

import pytest
from support.commit_crash import faulty_worker
from support.core_helpers import expected_totals, make_orders, orders_topic, totals_app, totals_in_store
from support.kafka_helpers import produce, read_messages, wait_for

from dagster_stateful.core.recovery.changelog_format import STATE_WRITE_HEADERS
from dagster_stateful.core.state.commit_metadata import decode_commit_metadata
from dagster_stateful.core.state.keys import message_prefix

COMPACT_FAST = {"segment.ms": "300", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "100"}


def changelog_records(bootstrap: str, topic: str) -> list[tuple[bytes | None, int]]:
    """(key, changelog offset) of every record left in the changelog."""
    return [(m.key(), m.offset() or 0) for m in read_messages(bootstrap, topic)]


def changelog_end(app, store: str) -> int:
    """Where the store's changelog (one partition) ends: the crashed commit's records come after it."""
    return app.kafka.watermarks(app.changelog_topic(store), [0])[0][1]


@pytest.mark.parametrize("machine", ["same", "new"])
def test_after_a_crash_mid_commit_and_compaction_a_restore_loses_nothing_and_on_its_own_state_doubles_nothing(
    kafka_bootstrap, unique_name, tmp_path, machine
):
    """Compaction leaves only the uncommitted record of every customer. On the same machine the store
    stands at the committed offset, so the restore skips those records and the totals are exact; on
    a new machine the committed records are gone, so it applies them (at-least-once may double,
    never lose) and counts them."""
    first, second = make_orders(300, customers=10), make_orders(300, customers=10, start=300)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 1, first)
    name = unique_name("totals")
    app = totals_app(kafka_bootstrap, source, tmp_path, name, changelog_config=COMPACT_FAST)
    assert app.run_worker(max_seconds=120).committed_offsets == {0: 300}
    committed_end = changelog_end(app, "totals")
    produce(kafka_bootstrap, source, second)

    worker = faulty_worker(
        "crash",
        tmp_path,
        bootstrap=kafka_bootstrap,
        source=source,
        state_dir=str(tmp_path),
        name=name,
        changelog_config=COMPACT_FAST,
    )
    assert worker.wait(timeout=120) == 9, worker.stderr.read().decode()[-2000:] if worker.stderr else ""
    changelog = app.changelog_topic("totals")
    customers = {key for key, _ in first}
    prefixes = tuple(message_prefix(customer) for customer in customers)
    roll = [(message_prefix(b"no-such-customer") + b"total", None)]

    def compacted() -> bool:
        # The cleaner never touches the active segment: a record written after segment.ms (here a
        # tombstone for a key no message has, written as committed state) rolls it, as later commits
        # would in production.
        produce(kafka_bootstrap, changelog, roll, STATE_WRITE_HEADERS)
        latest = [
            (key, offset)
            for key, offset in changelog_records(kafka_bootstrap, changelog)
            if key is not None and key.startswith(prefixes)
        ]
        return len(latest) == len(customers) and all(offset >= committed_end for _, offset in latest)

    wait_for(compacted, 120, "compaction to keep only the uncommitted record of each customer", interval=0.5)
    if machine == "new":
        app.clear_state()  # the full restore sees only the uncommitted records

    report = app.run_worker(max_seconds=120)

    assert report.stop_reason == "caught_up"
    restored = totals_in_store(app, 1)
    expected = expected_totals(first + second)
    assert set(restored) == set(expected), "no customer is missing"
    applied = sum(r.records_uncommitted_applied for r in report.restores)
    if machine == "same":
        assert restored == expected, "the store stood at the committed offset: nothing doubles"
        assert applied == 0 and sum(r.records_skipped for r in report.restores) == len(customers)
    else:
        short = {c: (restored[c], expected[c]) for c in expected if restored[c] < expected[c]}
        assert not short, f"at-least-once never loses: customers short (restored, expected): {short}"
        assert applied == len(customers)
    [(offset, metadata)] = app.kafka.committed(app.consumer_group, source, [0]).values()
    ends = decode_commit_metadata(metadata, offset, "test").changelog_ends
    assert ends == {"totals": changelog_end(app, "totals")}, "once past the source's end, commits record ends again"


def test_a_restore_during_a_commit_in_flight_applies_that_commit_later(kafka_bootstrap, unique_name, tmp_path):
    first, second = make_orders(300, customers=12), make_orders(300, customers=12, start=300)
    source = orders_topic(kafka_bootstrap, unique_name("orders"), 1, first)
    name = unique_name("totals")
    owner_dir, standby_dir = tmp_path / "owner", tmp_path / "standby"
    app = totals_app(kafka_bootstrap, source, owner_dir, name, changelog_config=COMPACT_FAST)
    app.run_worker(max_seconds=120)
    standby = app.bind(state_dir=standby_dir)
    standby.restore_partitions([0])
    produce(kafka_bootstrap, source, second)

    worker = faulty_worker(
        "pause",
        tmp_path,
        bootstrap=kafka_bootstrap,
        source=source,
        state_dir=str(owner_dir),
        name=name,
        changelog_config=COMPACT_FAST,
    )
    try:
        wait_for(
            lambda: (tmp_path / "paused").exists() or worker.poll() is not None,
            120,
            "the owner to deliver its changelog and start committing",
        )
        assert worker.poll() is None, worker.stderr.read().decode()[-2000:] if worker.stderr else ""
        standby.restore_partitions([0])  # reads the group's committed offset while the commit is in flight
        (tmp_path / "release").touch()
        assert worker.wait(timeout=120) == 0, worker.stderr.read().decode()[-2000:] if worker.stderr else ""
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()

    standby.restore_partitions([0])

    expected = expected_totals(first + second)
    assert totals_in_store(standby, 1) == expected, "the standby copy has the commit that was in flight"
    assert totals_in_store(app, 1) == expected
