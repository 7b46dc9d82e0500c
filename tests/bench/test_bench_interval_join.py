"""A smoke run of bench/bench_interval_join.py on tiny data against the session's broker (the engine
only: the Kafka Streams side needs a Maven build), so that the script behind the interval join
figures in bench/README.md cannot rot: under exactly-once it exits 0 only when the engine sent
exactly the pairs recomputed from the two topics, and prints its rate."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_interval_join_prints_a_checked_engine_run(kafka_bootstrap):
    command = [sys.executable, str(ROOT / "bench" / "bench_interval_join.py")]
    command += ["--orders", "3000", "--no-kafka-streams", "--guarantee", "exactly-once"]
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    finished = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)

    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    recomputed = re.search(r"^recomputed: ([\d,]+) pairs", finished.stdout, re.MULTILINE)
    sent = re.search(r"^engine run 1: [\d,]+ records/s .*?; ([\d,]+) pairs", finished.stdout, re.MULTILINE)
    assert recomputed and sent, finished.stdout
    assert sent.group(1) == recomputed.group(1) != "0", finished.stdout
