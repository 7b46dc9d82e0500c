"""Burrow-style lag evaluation, the bounded-worker exception, and the lag window: pure logic."""

from __future__ import annotations

import json

import pytest

from dagster_stateful.core.monitoring.lag import (
    LagSample,
    LagWindow,
    PartitionEvaluation,
    PartitionStatus,
    evaluate,
    evaluate_group,
)
from dagster_stateful.errors import ConfigurationError

WINDOW = 600.0


def samples(*points: tuple[int | None, int], start: float = 1000.0, step: float = 60.0) -> list[LagSample]:
    """(committed, high) points, `step` seconds apart from `start`."""
    return [LagSample(start + i * step, committed, high) for i, (committed, high) in enumerate(points)]


def judge(points: list[LagSample], now: float | None = None, idle: bool = False) -> PartitionEvaluation:
    return evaluate(points, now if now is not None else points[-1].timestamp, WINDOW, idle)


# --- LagSample and PartitionStatus -----------------------------------------------------------


def test_lag_is_high_minus_committed_floored_at_zero():
    assert LagSample(0.0, 40, 100).lag == 60
    assert LagSample(0.0, None, 100).lag == 100
    assert LagSample(0.0, None, 100, low=30).lag == 70, "a group that never committed starts at the low watermark"
    assert LagSample(0.0, 120, 100).lag == 0


def test_statuses_are_burrows_names_ordered_by_severity():
    assert [s.value for s in PartitionStatus] == ["OK", "WARN", "STALL", "STOP", "REWIND"]
    order = [
        PartitionStatus.OK,
        PartitionStatus.WARN,
        PartitionStatus.STALL,
        PartitionStatus.STOP,
        PartitionStatus.REWIND,
    ]
    assert [s.severity for s in order] == sorted(s.severity for s in order)
    assert len({s.severity for s in order}) == 5
    assert PartitionStatus("STOP") is PartitionStatus.STOP and PartitionStatus.STOP == "STOP"


# --- evaluate: Burrow's rules ----------------------------------------------------------------


def test_no_samples_is_ok():
    result = evaluate([], 0.0, WINDOW, False)
    assert result == PartitionEvaluation(PartitionStatus.OK, 0, "no samples yet")


@pytest.mark.parametrize("idle", [False, True])
def test_fewer_than_two_samples_is_ok_and_says_why(idle):
    result = judge(samples((10, 50)), idle=idle)
    assert result.status is PartitionStatus.OK and result.lag == 40
    assert "not enough samples" in result.reason and "40" in result.reason


def test_any_zero_lag_sample_is_ok_even_when_everything_else_looks_bad():
    # Went backwards and lag grew, but the consumer was caught up once within the window.
    points = samples((100, 100), (50, 120), (50, 300))
    result = judge(points, now=points[-1].timestamp + 10 * WINDOW)
    assert result.status is PartitionStatus.OK
    assert result.lag == 250
    assert "lag was 0 in 1 of 3 samples" in result.reason


def test_committed_offset_going_backwards_is_rewind():
    result = judge(samples((100, 200), (150, 220), (120, 240), (130, 260)))
    assert result.status is PartitionStatus.REWIND
    assert "went back from 150 to 120" in result.reason


def test_rewind_wins_over_stop_and_stall_and_idle():
    points = samples((100, 200), (80, 200), (80, 200))
    for idle in (False, True):
        assert judge(points, now=points[-1].timestamp + 2 * WINDOW, idle=idle).status is PartitionStatus.REWIND


def test_committed_offset_reset_to_none_counts_as_rewind():
    assert judge(samples((100, 200), (None, 200))).status is PartitionStatus.REWIND


def test_commit_not_moved_for_longer_than_the_window_is_stop():
    # Moved at t=1060, then nothing for 700 s with lag > 0.
    points = samples((100, 200), (150, 200), (150, 200), start=1000.0, step=60.0)
    result = evaluate(points, 1760.0, WINDOW, False)
    assert result.status is PartitionStatus.STOP
    assert result.lag == 50
    assert "has not moved for 700s" in result.reason and "600s window" in result.reason


def test_never_moving_offset_older_than_the_window_is_stop_not_stall():
    points = samples((100, 200), (100, 200), (100, 200), step=300.0)
    assert evaluate(points, points[0].timestamp + WINDOW + 1, WINDOW, False).status is PartitionStatus.STOP


def test_offsets_not_moving_within_the_window_is_stall():
    points = samples((100, 200), (100, 210), (100, 230), (100, 230))
    result = judge(points)
    assert result.status is PartitionStatus.STALL
    assert result.lag == 130
    assert "did not move over 4 samples (180s)" in result.reason


def test_never_committed_group_with_lag_is_stall():
    assert judge(samples((None, 10), (None, 10), (None, 10))).status is PartitionStatus.STALL


def test_moving_offsets_with_lag_never_shrinking_is_warn():
    result = judge(samples((100, 110), (200, 220), (300, 320), (400, 650), (500, 760)))
    assert result.status is PartitionStatus.WARN
    assert "lag grew from 10 to 260 over 5 samples" in result.reason


def test_lag_that_shrinks_once_is_not_warn():
    result = judge(samples((100, 110), (200, 250), (300, 320), (400, 650)))
    assert result.status is PartitionStatus.OK
    assert "lag went from 10 to 250" in result.reason


def test_flat_lag_with_moving_offsets_is_ok():
    assert judge(samples((100, 150), (200, 250), (300, 350))).status is PartitionStatus.OK


def test_shrinking_lag_is_ok():
    result = judge(samples((100, 500), (300, 600), (600, 700)))
    assert result.status is PartitionStatus.OK and result.lag == 100
    assert "committed offset moved from 100 to 600" in result.reason


def test_samples_out_of_order_are_judged_in_time_order():
    points = samples((100, 110), (200, 220), (300, 330))
    assert judge(list(reversed(points))).status is PartitionStatus.WARN


# --- evaluate: bounded workers are idle between runs by design -------------------------------


def test_idle_by_design_turns_stall_into_ok():
    result = judge(samples((100, 200), (100, 200), (100, 200)), idle=True)
    assert result.status is PartitionStatus.OK
    assert result.reason.startswith("idle between bounded runs")
    assert "would be STALL" in result.reason


def test_idle_by_design_turns_stop_into_ok():
    points = samples((100, 200), (150, 200), (150, 200))
    result = evaluate(points, 1760.0, WINDOW, True)
    assert result.status is PartitionStatus.OK
    assert result.reason.startswith("idle between bounded runs")
    assert "would be STOP" in result.reason


def test_idle_by_design_with_lag_growing_is_warn():
    points = samples((100, 110), (100, 150), (100, 200), (100, 300), (100, 350))
    result = judge(points, idle=True)
    assert result.status is PartitionStatus.WARN
    assert "lag grew from 10 to 250 over 5 samples" in result.reason
    assert "idle between bounded runs" in result.reason


def test_idle_by_design_stop_with_lag_growing_is_warn():
    points = samples((100, 200), (150, 200), (150, 400))
    assert evaluate(points, 1760.0, WINDOW, True).status is PartitionStatus.WARN


def test_idle_by_design_does_not_hide_warn_of_a_running_worker():
    points = samples((100, 110), (200, 220), (300, 330))
    assert judge(points, idle=True).status is PartitionStatus.WARN


# --- evaluate_group ----------------------------------------------------------------------------


def test_group_status_is_the_worst_partition():
    def at(status: PartitionStatus) -> PartitionEvaluation:
        return PartitionEvaluation(status, 1, "")

    assert evaluate_group({}) is PartitionStatus.OK
    assert evaluate_group({0: at(PartitionStatus.OK), 1: at(PartitionStatus.OK)}) is PartitionStatus.OK
    assert (
        evaluate_group({0: at(PartitionStatus.STALL), 1: at(PartitionStatus.WARN), 2: at(PartitionStatus.OK)})
        is PartitionStatus.STALL
    )
    assert evaluate_group({0: at(PartitionStatus.STOP), 1: at(PartitionStatus.STALL)}) is PartitionStatus.STOP
    assert evaluate_group({0: at(PartitionStatus.REWIND), 1: at(PartitionStatus.STOP)}) is PartitionStatus.REWIND


# --- LagWindow -----------------------------------------------------------------------------------


def test_window_keeps_the_most_recent_n_samples_per_partition():
    window = LagWindow(window_seconds=10_000.0)
    for i in range(15):
        window.add(0, LagSample(float(i), i, 100))
    window.add(1, LagSample(14.0, 7, 100))
    assert window.max_samples == 10
    assert [s.committed for s in window.get(0)] == list(range(5, 15))
    assert [s.committed for s in window.get(1)] == [7]


def test_window_drops_samples_older_than_window_seconds():
    window = LagWindow(window_seconds=100.0, max_samples=10)
    for t in (0.0, 50.0, 100.0, 150.0):
        window.add(0, LagSample(t, 1, 2))
    assert [s.timestamp for s in window.get(0)] == [50.0, 100.0, 150.0]
    window.trim(now=260.0)
    assert window.get(0) == [] and window.samples == {}


def test_window_add_trims_other_partitions_as_of_now():
    window = LagWindow(window_seconds=100.0)
    window.add(0, LagSample(0.0, 1, 2))
    window.add(1, LagSample(500.0, 1, 2))
    assert set(window.samples) == {1}


def test_window_keeps_samples_in_time_order():
    window = LagWindow()
    window.add(0, LagSample(20.0, 2, 5))
    window.add(0, LagSample(10.0, 1, 5), now=20.0)
    assert [s.timestamp for s in window.get(0)] == [10.0, 20.0]


def test_window_rejects_nonsense_limits():
    with pytest.raises(ConfigurationError, match="window_seconds > 0"):
        LagWindow(window_seconds=0.0)
    with pytest.raises(ConfigurationError, match="max_samples >= 1"):
        LagWindow(max_samples=0)


def test_window_json_round_trip_survives_json_text():
    window = LagWindow()
    window.add(0, LagSample(1.5, None, 10))
    window.add(0, LagSample(2.5, 4, 12))
    window.add(3, LagSample(2.5, 7, 7))
    stored = json.loads(json.dumps(window.to_json()))
    assert LagWindow.from_json(stored) == window
    small = LagWindow(window_seconds=30.0, max_samples=3)
    small.add(2, LagSample(1.0, 1, 2))
    assert LagWindow.from_json(small.to_json(), window_seconds=30.0, max_samples=3) == small


def test_window_from_json_applies_the_current_sample_limit():
    window = LagWindow()
    for i in range(10):
        window.add(0, LagSample(float(i), i, 100))
    loaded = LagWindow.from_json(window.to_json(), max_samples=4)
    assert [s.committed for s in loaded.get(0)] == [6, 7, 8, 9]


@pytest.mark.parametrize(
    "junk",
    [
        None,
        "",
        "not json",
        42,
        [],
        ["partitions"],
        {},
        {"version": 1},
        {"partitions": {}},
        {"version": 2, "partitions": {}},
        {"version": 1, "partitions": []},
        {"version": 1, "partitions": {"0": "x"}},
        {"version": 1, "partitions": {"zero": [[1.0, 1, 2]]}},
        {"version": 1, "partitions": {"-1": [[1.0, 1, 2]]}},
        {"version": 1, "partitions": {"0": [[1.0, 1]]}},
        {"version": 1, "partitions": {"0": [{"timestamp": 1.0, "committed": 1, "high": 2}]}},
        {"version": 1, "partitions": {"0": [["1.0", 1, 2]]}},
        {"version": 1, "partitions": {"0": [[1.0, "1", 2]]}},
        {"version": 1, "partitions": {"0": [[1.0, 1, None]]}},
        {"version": 1, "partitions": {"0": [[1.0, 1, 2.5]]}},
        {"version": 1, "partitions": {"0": [[True, 1, 2]]}},
        {"version": 1, "partitions": {"0": [[float("nan"), 1, 2]]}},
        {"version": 1, "partitions": {"0": [[10**400, 1, 2]]}},
        {"version": 1, "partitions": {"0": [[1.0, 1, 2]], "1": [[1.0, "bad", 2]]}},
    ],
)
def test_window_from_junk_is_empty(junk):
    window = LagWindow.from_json(junk, window_seconds=60.0, max_samples=5)
    assert window.samples == {}
    assert (window.window_seconds, window.max_samples) == (60.0, 5)


def test_window_from_json_accepts_integer_timestamps_and_empty_partitions():
    loaded = LagWindow.from_json({"version": 1, "partitions": {"0": [[5, 1, 2]], "1": []}})
    assert loaded.samples == {0: [LagSample(5.0, 1, 2)]}


def test_a_window_keeps_low_watermarks_and_reads_samples_stored_before_them():
    window = LagWindow(window_seconds=10_000.0)
    window.add(0, LagSample(1.0, None, 100, low=40))
    assert LagWindow.from_json(window.to_json()).get(0)[0].lag == 60
    older = {"version": 1, "partitions": {"0": [[1.0, None, 100]]}}
    assert LagWindow.from_json(older, window_seconds=10_000.0).get(0) == [LagSample(1.0, None, 100, 0)]
