"""A smoke run of bench/bench_growth.py on tiny data, so that the cost-growth harness cannot rot:
this engine and Kafka Streams (built with Maven, one thread) on a processing point and a restore
point, and the engine's local-snapshot and Spark restore paths on the restore point, against the
session's broker; the harness checks each run's totals against the source, and each snapshot
path's store by digest against a changelog replay.
What a user looks at is checked here: the exit status, a point per system, curve and size in
growth.json, and a PNG chart."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS = ["engine", "kafka-streams"]


def test_each_system_gets_a_checked_point_on_each_curve(kafka_bootstrap, tmp_path):
    out = tmp_path / "growth"
    command = [
        sys.executable,
        str(ROOT / "bench" / "bench_growth.py"),
        *("--keys", "40", "--messages", "1500", "--restore-keys", "600", "--commit-interval", "1"),
        *("--out", str(out), "--systems", *SYSTEMS),
    ]
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    finished = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)

    assert finished.returncode == 0, finished.stdout[-4000:] + finished.stderr[-4000:]
    points = orjson.loads((out / "growth.json").read_bytes())["points"]
    by = {(p["system"], p["curve"], p["keys"]): p for p in points}
    snapshot_paths = {
        (system, "restore", 600) for system in ("engine-snapshot", "engine-snapshot-parquet", "engine-spark")
    }
    assert set(by) == {(s, "processing", 40) for s in SYSTEMS} | {(s, "restore", 600) for s in SYSTEMS} | snapshot_paths
    assert all(p["rate"] > 0 and (p["peak_rss_mib"] or 0) > 0 for p in points if p["system"] in SYSTEMS), points
    assert all(by[path]["rate"] > 0 and by[path]["seconds_until_processing"] > 0 for path in snapshot_paths)
    assert "check: every path gives the same digests as the changelog replay" in finished.stdout
    assert by[("engine", "processing", 40)]["messages"] == 1500
    assert all(by[(s, "restore", 600)]["seconds_until_processing"] is not None for s in SYSTEMS)
    assert (out / "growth.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert finished.stdout.count("(checked;") == 2 + 2 + 2, "processing, building the stores, restoring"
