"""A smoke run of bench/bench_imports.py, so that the script behind the import costs bench/README.md
quotes cannot rot: it exits 0 and prints seconds and a resident size for every case."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = ["python", "the App", "the App, a columnar aggregation declared", "a restore child"]


def test_bench_imports_prints_seconds_and_memory_for_every_case():
    command = [sys.executable, str(ROOT / "bench" / "bench_imports.py"), "--runs", "1"]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)

    assert finished.returncode == 0, finished.stderr
    for case in CASES:
        row = re.search(rf"^{re.escape(case)}\s+([\d.]+)\s+(\d+) MiB$", finished.stdout, re.MULTILINE)
        assert row is not None, f"no row for {case!r}:\n{finished.stdout}"
        assert int(row.group(2)) > 0
