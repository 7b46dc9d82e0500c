"""A smoke run of bench/bench_standbys.py on tiny data against the session's broker, so that the
script behind the standby figures in bench/README.md cannot rot: it exits 0, checks the survivor's
totals in both variants, and prints a row for each, where the survivor with standbys restores
fewer records than the one without."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_standbys_prints_a_checked_row_with_and_without_standbys(kafka_bootstrap):
    command = [sys.executable, str(ROOT / "bench" / "bench_standbys.py")]
    command += ["--keys", "3000", "--session-timeout-ms", "1500"]
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    finished = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)

    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    assert finished.stdout.count("checked: the survivor holds all 3,000 totals") == 2, finished.stdout
    rows = dict(re.findall(r"^\| ([01]) \| [\d.]+ \| [\d.]+ \| [\d.]+ \| ([\d,]+) \|$", finished.stdout, re.MULTILINE))
    assert set(rows) == {"0", "1"}, finished.stdout
    assert int(rows["1"].replace(",", "")) < int(rows["0"].replace(",", "")), finished.stdout
