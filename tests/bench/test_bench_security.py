"""A smoke run of bench/bench_security.py on tiny data, so that the script behind security's cost in
bench/README.md cannot rot: it starts its secured broker, exits 0, and prints a row with a positive
rate for each variant and a row with their ratio."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_bench_security_prints_both_variants_and_their_ratio():
    command = [sys.executable, str(ROOT / "bench" / "bench_security.py")]
    command += ["--messages", "3000", "--keys", "300", "--repetitions", "1", "--warmups", "0"]
    finished = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)

    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    for variant in ("PLAINTEXT", "SASL_SSL"):
        row = re.search(rf"^\| {variant} \| 1 \| ([\d,]+) \([\d,]+-[\d,]+\) \| ([\d,]+) \|", finished.stdout, re.M)
        assert row is not None, f"no row for {variant}:\n{finished.stdout}"
        assert all(int(rate.replace(",", "")) > 0 for rate in row.groups())
    ratio = re.search(r"^\| SASL_SSL / PLAINTEXT \| \| ([\d.]+) \|", finished.stdout, re.MULTILINE)
    assert ratio is not None and float(ratio.group(1)) > 0, finished.stdout
    assert "RATIO SASL_SSL / PLAINTEXT" in finished.stdout
