"""At-least-once windows redone after a crash between a commit's changelog and its source commit.

The worker below dies right before its source commit, every changelog record of the commit
(window tallies and the partition's stream time) and every output delivered. The messages are
then processed again: on top of the local state, or on a new machine after compaction left only
the uncommitted records of many keys. Windows, late orders and stream time are recomputed from
the source topic, never read back from the code under test.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest
from faults.harness import TimedOrder, produce_timed_orders, replay_windows
from support import core_helpers
from support.commit_crash import faulty_worker
from support.core_helpers import WINDOW_GRACE_MS, WINDOW_MS
from support.kafka_helpers import create_topic, produce, read_messages, wait_for
from test_uncommitted_restore import COMPACT_FAST, changelog_end, changelog_records

from dagster_stateful.core.recovery.changelog_format import STATE_WRITE_HEADERS
from dagster_stateful.core.state.keys import STREAM_TIME_KEY

BASE_MS = (time.time_ns() // 1_000_000_000 - 3600) * 1000
"""A window boundary (a multiple of `WINDOW_MS`) an hour ago: within the topics' retention."""


def order(number: int, customer: int, at_ms: int) -> TimedOrder:
    value = orjson.dumps({"id": number, "customer": f"c{customer}", "amount": 1 + number % 7})
    return f"c{customer}".encode(), value, BASE_MS + at_ms


FIRST = [order(n, n % 3, 80 * n) for n in range(12)]
"""Committed before the crash: window 0 of every customer, stream time 880 ms."""
SECOND = [order(12 + n, n % 3, 1100 + 40 * n) for n in range(10)] + [
    order(22 + n, n % 3, 2500 + 10 * n) for n in range(3)
]
"""Processed, then redone: window 1 (1100-1460 ms), then stream time 2520 ms, which closes windows 0
and 1. After the crash, stream time 2520 would take every order of window 1 for late."""


def emitted_tallies(bootstrap: str, topic: str) -> dict[tuple[str, int], dict]:
    """The last tally the output holds for each window (at-least-once may send a window twice)."""
    last: dict[tuple[str, int], dict] = {}
    for message in read_messages(bootstrap, topic):
        result = orjson.loads(message.value())
        last[(message.key().decode(), result["start"])] = result["value"]
    return last


def stored_tallies(app) -> dict[tuple[str, int], dict]:
    with app.read_state("windows") as reader:
        return {(_text(entry.message_key), entry.start): entry.value for entry in reader.windows()}


def wait_until_compaction_keeps_only_uncommitted_stream_time(
    bootstrap: str, changelog: str, committed_end: int
) -> None:
    """Until the changelog's only stream-time record lies past `committed_end` (where the changelog
    ended at the last commit). The cleaner never touches the active segment: a record written after
    segment.ms (a tombstone for a window nobody has, written as committed state) rolls it, as later
    commits would in production."""
    roll = [(b"\x00" * 8 + b"\x00\x00\x00\x07nobody!", None)]

    def compacted() -> bool:
        produce(bootstrap, changelog, roll, STATE_WRITE_HEADERS)
        times = [offset for key, offset in changelog_records(bootstrap, changelog) if key == STREAM_TIME_KEY]
        return len(times) == 1 and times[0] >= committed_end

    wait_for(compacted, 120, "compaction to keep only the uncommitted stream-time record", interval=0.5)


@pytest.mark.parametrize("factory", ["windows_app", "columnar_windows_app"])
@pytest.mark.parametrize("machine", ["same", "new"])
def test_at_least_once_windows_redone_after_a_crash_mid_commit_judge_no_order_late_and_lose_nothing(
    kafka_bootstrap, unique_name, tmp_path, machine, factory
):
    """`columnar_windows_app` folds its windows a consumed batch at a time and keeps their totals."""
    source, name = unique_name("orders"), unique_name("windows")
    create_topic(kafka_bootstrap, source, 1)
    produce_timed_orders(kafka_bootstrap, source, FIRST)
    make_app = getattr(core_helpers, factory)
    app = make_app(kafka_bootstrap, source, tmp_path, name, changelog_config=COMPACT_FAST)
    assert app.run_worker(max_seconds=120).committed_offsets == {0: len(FIRST)}
    committed_end = changelog_end(app, "windows")
    produce_timed_orders(kafka_bootstrap, source, SECOND)

    worker = faulty_worker(
        "crash",
        tmp_path,
        factory=factory,
        bootstrap=kafka_bootstrap,
        source=source,
        state_dir=str(tmp_path),
        name=name,
        changelog_config=COMPACT_FAST,
    )
    assert worker.wait(timeout=120) == 9, worker.stderr.read().decode()[-2000:] if worker.stderr else ""
    if machine == "new":
        wait_until_compaction_keeps_only_uncommitted_stream_time(
            kafka_bootstrap, app.changelog_topic("windows"), committed_end
        )
        app.clear_state()

    report = app.run_worker(max_seconds=120)

    assert report.stop_reason == "caught_up" and report.committed_offsets == {0: len(FIRST) + len(SECOND)}
    replayed = replay_windows(read_messages(kafka_bootstrap, source), WINDOW_MS, WINDOW_GRACE_MS)
    assert not replayed.late_ids and len(replayed.final) == 6, "the recompute: six windows closed, no order late"
    dead = [orjson.loads(m.value()) for m in read_messages(kafka_bootstrap, app.dead_letter_topic)]
    assert dead == [], "no order is late: the redone ones are judged by the stream time of the last commit"
    emitted = emitted_tallies(kafka_bootstrap, f"{name}-out")
    stored = stored_tallies(app)
    if factory == "columnar_windows_app":  # its windows keep the total alone
        replayed = replayed.totals_only()
        emitted, stored = as_totals(emitted), as_totals(stored)
    if machine == "same":  # the local state stands at the commit: the restore skips the uncommitted records
        assert emitted == replayed.final, "each closed window's tally, as recomputed"
        assert stored == replayed.kept, "the open windows' tallies, as recomputed"
    else:  # compaction took the committed records: at-least-once may double, never lose
        short = {w: (emitted.get(w), t) for w, t in replayed.final.items() if not _covers(emitted.get(w), t)}
        assert not short, f"closed windows emitted short or not at all (emitted, recomputed): {short}"
        short = {w: (stored.get(w), t) for w, t in replayed.kept.items() if not _covers(stored.get(w), t)}
        assert not short, f"open windows short in the store (stored, recomputed): {short}"
    assert report.restores and all(r.completed for r in report.restores)


def as_totals(windows: dict[tuple[str, int], Any]) -> dict[tuple[str, int], dict]:
    return {window: {"total": total} for window, total in windows.items()}


def _covers(tally: dict | None, expected: dict) -> bool:
    return tally is not None and all(tally[name] >= expected[name] for name in expected)


def _text(key: object) -> str:
    return key.decode() if isinstance(key, bytes) else str(key)
