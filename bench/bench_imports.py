"""What a worker process pays to load the engine before it consumes anything: seconds and resident memory.

Each case runs in a fresh interpreter (`python -c`), --runs times, and prints the best seconds and
the resident set size (VmRSS) once it is done:

- `python`: the interpreter alone;
- `the App`: `from dagster_stateful.core import App` (what every worker and restore job imports);
- `the App, a stateful update declared`: the App plus an app with a stateful `update` step;
- `the App, a columnar aggregation declared`: the App plus an app with `aggregate(Sum("amount"))`,
  which loads NumPy and Arrow for the columnar path;
- `a restore child`: what a child process that replays changelogs imports
  (`recovery.parallel_replay`).

    .venv/bin/python bench/bench_imports.py
    .venv/bin/python bench/bench_imports.py --runs 5
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys

PRELUDE = "import time\nbegan = time.perf_counter()\n"
REPORT = (
    "\nseconds = time.perf_counter() - began\n"
    "rss = int(open('/proc/self/status').read().split('VmRSS:')[1].split()[0]) // 1024\n"
    "print(seconds, rss)\n"
)
APP = "from dagster_stateful.core import App\n"
DECLARE = "app = App(name='bench', source='orders', stores=['totals'], kafka='127.0.0.1:9')\n"

CASES = {
    "python": "",
    "the App": APP,
    "the App, a stateful update declared": APP
    + DECLARE
    + "app.dataframe().update(lambda value, state: None, stateful=True)\n",
    "the App, a columnar aggregation declared": APP
    + "from dagster_stateful.core import Sum\n"
    + DECLARE
    + "app.dataframe().aggregate(Sum('amount'))\n",
    "a restore child": "import dagster_stateful.core.recovery.parallel_replay\n",
}


def measure(code: str) -> tuple[float, int]:
    """(seconds, MiB resident) of running `code` in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", PRELUDE + code + REPORT], capture_output=True, text=True, check=True)
    seconds, rss = done.stdout.split()
    return float(seconds), int(rss)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh interpreters per case (the best is printed)")
    args = parser.parse_args()
    print(f"python {platform.python_version()}, {platform.platform()}, best of {args.runs} fresh interpreters")
    print(f"{'case':<44}{'seconds':>9}{'RSS':>10}")
    for name, code in CASES.items():
        runs = [measure(code) for _ in range(args.runs)]
        seconds = min(run[0] for run in runs)
        rss = min(run[1] for run in runs)
        print(f"{name:<44}{seconds:>9.3f}{rss:>6} MiB")


if __name__ == "__main__":
    main()
