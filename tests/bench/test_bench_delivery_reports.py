"""A smoke run of bench/bench_delivery_reports.py on tiny data, against the test session's broker, so
that the script behind the delivery reports' cost in bench/README.md cannot rot: it exits 0, the
engine's tracker saw every partition's deliveries with reports on and none with failures only,
and it prints every row of its table."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_delivery_reports_prints_a_rate_for_every_variant(kafka_bootstrap):
    command = [sys.executable, str(ROOT / "bench" / "bench_delivery_reports.py"), "--records", "3000"]
    command += ["--repetitions", "1", "--partitions", "3"]
    environment = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    finished = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)

    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    assert "reports" in finished.stdout and "(partitions with a reported offset: 3;" in finished.stdout
    assert "(partitions with a reported offset: 0;" in finished.stdout, "failures only: no success reported"
    for variant in ("reports", "errors only", "errors only, no header"):
        row = re.search(rf"^\| {re.escape(variant)} \| ([\d,]+) \| ([\d.]+) \|$", finished.stdout, re.MULTILINE)
        assert row is not None, f"no row for {variant!r}:\n{finished.stdout}"
        assert int(row.group(1).replace(",", "")) > 0
