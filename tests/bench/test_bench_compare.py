"""A smoke run of bench/bench_compare.py on tiny data, so that the side-by-side harness cannot rot.

Every system (this engine with a stateful update and with an aggregation, Quix Streams in its own
venv, Kafka Streams built with Maven, with one thread; its row with one thread per core differs only
in a thread count) runs every workload but "join" once (the aggregating engine processing only; Quix not the
re-keying "group_by"), against the session's broker; the harness itself checks each run's final
state against the totals recomputed from the source (per region for "group_by"). What a user
would look at is then checked here: the exit status, one figure per system and workload in
results.json, the ceilings, a PNG chart, and the targets' verdicts, with the profile of each
missed rate. The "join" workload (a stream-table join, then a sum per tier) runs in a test of its
own, with the systems that run it (not Quix), so that `-k join` selects it alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS = ["engine", "engine-aggregate", "quix", "kafka-streams"]
"""Every system but `kafka-streams-N`, which is `kafka-streams` with one stream thread per core."""
RESTORING = ["engine", "quix", "kafka-streams"]
REKEYING = ["engine", "engine-aggregate", "kafka-streams"]
"""The systems of the "group_by" and "join" workloads: Quix's runner has no group_by."""
WORKLOADS = ["10k keys", "1M keys", "restore", "group_by"]
"""Every workload but "join" (test_join_workload_runs_and_is_checked)."""
SESSIONING = ["engine", "kafka-streams"]
"""The systems of the "sessions" workload: this engine's session windows and Kafka Streams'."""
JOINING = ["engine-aggregate", "kafka-streams"]
"""The systems test_join_workload_runs_and_is_checked runs: the ones its targets compare."""


def test_every_system_runs_every_workload_and_is_checked(kafka_bootstrap, tmp_path):
    out = tmp_path / "results"
    command = [
        sys.executable,
        str(ROOT / "bench" / "bench_compare.py"),
        *("--messages", "2000", "--keys", "40", "--distinct-keys", "2000", "--restore-messages", "12"),
        *("--customers", "300", "--regions", "25"),
        *("--commit-interval", "1", "--runs", "1", "--out", str(out), "--systems", *SYSTEMS),
        *("--workloads", *WORKLOADS),
    ]
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    finished = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)

    assert finished.returncode == 0, finished.stdout[-4000:] + finished.stderr[-4000:]
    document = orjson.loads((out / "results.json").read_bytes())
    figures = {(figure["system"], figure["workload"]): figure for figure in document["figures"]}
    expected = {(system, workload) for system in SYSTEMS for workload in ("10k keys", "1M keys")}
    expected |= {(system, "restore") for system in RESTORING}
    expected |= {(system, "group_by") for system in REKEYING}
    assert set(figures) == expected
    for figure in figures.values():
        (run,) = figure["runs"]
        assert run["rate"] > 0 and run["peak_rss_mib"] > 0, figure
    for system in RESTORING:
        restore = figures[(system, "restore")]["runs"][0]
        assert restore["restored_records"] >= 2000, f"{system} restored the whole store"
    assert {ceiling["name"] for ceiling in document["ceilings"]} >= {"consume only"}
    assert "group_by" in {ceiling["workload"] for ceiling in document["ceilings"]}
    assert finished.stdout.count("2,000 re-keyed") == 2, "each engine re-keyed every order once"
    assert "Quix Streams left out" in finished.stdout
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert finished.stdout.count("(checked;") == len(expected)
    targets = document["targets"]
    assert len(targets) == 8, "a rate and a peak RSS verdict for each of the four targets"
    assert any(verdict["target"].startswith("group_by: engine-aggregate at least 1.5x") for verdict in targets)
    for verdict in targets:
        rate = "rate" in verdict["target"]
        assert ("MISSED" if not verdict["met"] else "met") in finished.stdout
        assert bool(verdict["profile"]) == (rate and not verdict["met"]), "a missed rate, and only that, is profiled"
        if verdict["profile"]:
            assert "engine functions by cumulative time" in verdict["profile"]
            assert "dagster_stateful" in verdict["profile"]


def test_join_workload_runs_and_is_checked(kafka_bootstrap, tmp_path):
    """The "join" workload once, small: a compacted table of 300 customers in 4 tiers, 2,000 orders
    joined with it and summed per tier by the columnar engine and Kafka Streams (a KTable); the
    harness checks each run's totals per tier against the ones recomputed from the orders and the
    table. (The stateful update's engine runs the same join and group_by through the same runner,
    and its re-keying is covered above; the ceilings' loop too: both left out to keep this short.)"""
    out = tmp_path / "results"
    command = [
        sys.executable,
        str(ROOT / "bench" / "bench_compare.py"),
        *("--workloads", "join", "--messages", "2000", "--customers", "300", "--tiers", "4"),
        *("--commit-interval", "1", "--runs", "1", "--out", str(out), "--systems", *JOINING),
        *("--no-profile", "--no-ceilings"),
    ]
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    finished = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)

    assert finished.returncode == 0, finished.stdout[-4000:] + finished.stderr[-4000:]
    document = orjson.loads((out / "results.json").read_bytes())
    figures = {(figure["system"], figure["workload"]): figure for figure in document["figures"]}
    assert set(figures) == {(system, "join") for system in JOINING}
    for figure in figures.values():
        (run,) = figure["runs"]
        assert run["rate"] > 0 and run["peak_rss_mib"] > 0, figure
    assert "produced 300 customers (4 tiers) to the compacted table" in finished.stdout
    assert finished.stdout.count("(checked;") == len(JOINING)
    assert finished.stdout.count("2,000 re-keyed") == 1, "the engine joined and re-keyed every order once"
    assert document["ceilings"] == []
    targets = document["targets"]
    assert [verdict["target"] for verdict in targets] == [
        "join: engine-aggregate at least 1.5x Kafka Streams' rate",
        "join: engine-aggregate's peak RSS no higher than Kafka Streams'",
    ]


def test_sessions_workload_runs_and_is_checked(kafka_bootstrap, tmp_path):
    """The "sessions" workload once, small: 2,000 orders over 40 keys in bursts, summed per session
    by this engine's session windows and Kafka Streams' SessionWindows; the harness checks every
    session's end and total against the ones recomputed from the orders."""
    out = tmp_path / "results"
    command = [
        sys.executable,
        str(ROOT / "bench" / "bench_compare.py"),
        *("--workloads", "sessions", "--messages", "2000", "--keys", "40"),
        *("--commit-interval", "1", "--runs", "1", "--out", str(out), "--systems", *SESSIONING),
        *("--no-profile", "--no-ceilings"),
    ]
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    finished = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)

    assert finished.returncode == 0, finished.stdout[-4000:] + finished.stderr[-4000:]
    document = orjson.loads((out / "results.json").read_bytes())
    figures = {(figure["system"], figure["workload"]): figure for figure in document["figures"]}
    assert set(figures) == {(system, "sessions") for system in SESSIONING}
    assert finished.stdout.count("(checked;") == len(SESSIONING)
    assert "keys in bursts of 5" in finished.stdout
    assert [verdict["target"] for verdict in document["targets"]] == [
        "sessions: engine at least 1.5x Kafka Streams' rate",
        "sessions: engine's peak RSS no higher than Kafka Streams'",
    ]
