"""A smoke run of bench/bench_decode.py on small batches, so that the script behind the decoding
figures in bench/README.md cannot rot: it exits 0, both decoders agreed on every shape (the script
checks that before timing), and it prints a time per value for each."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_decode_prints_both_decoders_for_every_shape():
    command = [sys.executable, str(ROOT / "bench" / "bench_decode.py"), "--values", "50", "--number", "2"]
    command += ["--repeat", "1"]
    finished = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)

    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    rows = re.findall(r"^(orders, 3 fields|flat, 21 fields|nested) +\d+ +(\d+) ns +(\d+) ns$", finished.stdout, re.M)
    assert [name for name, _, _ in rows] == ["orders, 3 fields", "flat, 21 fields", "nested"], finished.stdout
    assert all(int(arrow) > 0 and int(ours) > 0 for _, arrow, ours in rows), finished.stdout
