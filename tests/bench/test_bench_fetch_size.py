"""A smoke run of bench/bench_fetch_size.py on tiny data, against the test session's broker, so that
the script behind the fetch settings' figures in bench/README.md cannot rot: it exits 0, every run's
totals were checked, and it prints a line for each fetch size and queue backoff."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_fetch_size_prints_the_rate_and_peak_of_every_fetch_size_and_backoff(kafka_bootstrap):
    command = [sys.executable, str(ROOT / "bench" / "bench_fetch_size.py"), "--messages", "3000", "--keys", "50"]
    command += ["--fetch-mib", "2", "1", "--queue-backoff-ms", "1000", "20", "--rounds", "1"]
    environment = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    finished = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)

    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    line = r"^50 keys, (\d) MiB fetches, (\d+) ms queue backoff: ([\d,]+) msg/s .* peak RSS ([\d,]+) MiB$"
    rows = re.findall(line, finished.stdout, re.M)
    variants = sorted((mib, backoff) for mib, backoff, _, _ in rows)
    assert variants == [("1", "1000"), ("1", "20"), ("2", "1000"), ("2", "20")], finished.stdout
    assert all(int(rate.replace(",", "")) > 0 and int(peak.replace(",", "")) > 0 for _, _, rate, peak in rows)
    assert "check: every run's totals equal the totals recomputed from the source" in finished.stdout
