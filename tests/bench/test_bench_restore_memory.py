"""A smoke run of bench/bench_restore_memory.py on tiny data, against the test session's broker, so
that the script behind the full restore's memory figures in bench/README.md cannot rot: it exits 0,
every variant restored every key, and it prints a line for each."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_restore_memory_prints_the_rate_and_peak_of_every_variant(kafka_bootstrap):
    command = [sys.executable, str(ROOT / "bench" / "bench_restore_memory.py"), "--keys", "3000", "--rounds", "1"]
    environment = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    finished = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)

    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    rows = re.findall(
        r"^chunk [\d,]+ keys, partition fetch \d+ MiB, queue backoff \d+ ms: "
        r"([\d,]+) records/s .* peak RSS ([\d,]+) MiB$",
        finished.stdout,
        re.MULTILINE,
    )
    assert len(rows) >= 5, finished.stdout
    assert all(int(rate.replace(",", "")) > 0 and int(peak.replace(",", "")) > 0 for rate, peak in rows)
    assert "check: every restored store has the first one's digest" in finished.stdout
