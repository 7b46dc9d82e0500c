"""A smoke run of bench/bench_new_topic.py against the test session's broker, so that the script
behind the new topic's first pause in bench/README.md cannot rot: it exits 0 and prints a row with
seconds for both variants."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_new_topic_prints_seconds_for_both_variants(kafka_bootstrap):
    command = [sys.executable, str(ROOT / "bench" / "bench_new_topic.py"), "--topics", "1", "--partitions", "2"]
    environment = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    finished = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)

    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    for variant in ("engine (first pause 20 ms)", "first pause 100 ms"):
        row = re.search(rf"^\| {re.escape(variant)} \| ([\d.]+) \| ", finished.stdout, re.MULTILINE)
        assert row is not None, f"no row for {variant!r}:\n{finished.stdout}"
        assert float(row.group(1)) > 0
