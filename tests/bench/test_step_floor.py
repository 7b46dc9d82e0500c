"""A smoke run of bench/step_floor.py on tiny data, so that the script behind the floors that
bench/README.md quotes cannot rot: it exits 0 and prints a positive rate for each of its loops."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOOPS = ["decode", "decode + get/set step", "decode + aggregate"]


def test_step_floor_prints_a_rate_for_every_loop():
    command = [sys.executable, str(ROOT / "bench" / "step_floor.py"), "--messages", "2000", "--keys", "50"]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)

    assert finished.returncode == 0, finished.stderr
    for loop in LOOPS:
        row = re.search(rf"^{re.escape(loop)}\s+([\d.]+)\s+([\d,]+)\s+([\d,]+)$", finished.stdout, re.MULTILINE)
        assert row is not None, f"no row for {loop!r}:\n{finished.stdout}"
        assert float(row.group(1)) > 0 and int(row.group(3).replace(",", "")) > 0
