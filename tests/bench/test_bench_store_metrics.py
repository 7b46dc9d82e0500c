"""A smoke run of bench/bench_store_metrics.py on tiny data, so that the script behind the store
metrics' cost in bench/README.md cannot rot: it exits 0, builds its "metrics off" copy from git,
and prints a row with both rates for each workload."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = [
    "update, 10k keys",
    "update, new keys",
    "aggregate, 10k keys",
    "state alone: get + set",
    "state alone: fold",
]


def test_bench_store_metrics_prints_both_rates_for_every_workload():
    command = [sys.executable, str(ROOT / "bench" / "bench_store_metrics.py")]
    command += ["--messages", "2000", "--sessions", "1", "--rounds", "1"]
    finished = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)

    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    for workload in WORKLOADS:
        row = re.search(rf"^\| {re.escape(workload)} \| ([\d,]+) \| ([\d,]+) \|", finished.stdout, re.MULTILINE)
        assert row is not None, f"no row for {workload!r}:\n{finished.stdout}"
        assert all(int(rate.replace(",", "")) > 0 for rate in row.groups())
    assert "'get_count': 2000" in finished.stdout, "the 'on' copy reports its store metrics"
