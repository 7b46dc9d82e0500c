"""Fault-injection benchmark: the cases of tests/faults/ repeated at scale, with a table of what they found.

Runs the seven cases of the issue "Correct under every failure" (tests/faults/scenarios.py: real
worker subprocesses against a real broker), and three under exactly-once (1e: case 1's SIGKILL
storm with an output topic; 8e: a zombie worker frozen with SIGSTOP, fenced by its successor with
the same group_instance_id, resumed; 9e: a worker frozen until the group evicts it, fenced by the
group's generation once resumed),
--repetitions times each and prints, per case:

    case | faults injected | messages | lost | doubled | outputs missing / doubled | recovery seconds

- faults injected: kills that landed, broker outages, damaged stores, recreated changelogs,
  retention cuts, read-only directories;
- messages: source messages the final state was checked against (read back from Kafka);
- lost / doubled: over customers, sum of max(0, expected - counted) and max(0, counted - expected)
  of the per-customer order count in the store ("lost" must be 0; "doubled" is what at-least-once
  allows after a crash, and must be 0 under exactly-once);
- outputs missing / doubled (exactly-once cases): orders absent from, or repeated in, the output
  topic as a read_committed reader sees it (both must be 0);
- recovery seconds: from the restart after the (last) fault until the worker stopped caught up
  (process start, group join, restores and the messages left); median and max over repetitions.

Below the table it prints, per case, where the kills landed, the errors workers stopped with,
anything a failed run committed anyway, and other ways out that were tried. The script exits 1
when any order was lost, an exactly-once case was not exact, or a final run did not end caught up
with no lag.

With `--seeds N` it runs the soak instead: every storm (1 the SIGKILL storm, 1w the windowed one,
2 two workers killed in turn, 3 the broker outage) N times under each guarantee, each run with a
fresh seed, and prints one row per run with its seed (`FAULT_SEED=<seed>` replays a test's random
choices; `--seed` here replays the soak's):

    storm | guarantee | seed | faults | messages | state wiped | compacted away | lost | doubled | final run

"state wiped" counts restarts on a deleted state directory (full restores), "compacted away" the
changelog records compaction removed, and "uncommitted applied" the records of uncommitted messages
that restores applied because compaction left a gap in the range they read: the only way
at-least-once doubles. It exits 1 when anything was lost, anything doubled under exactly-once,
anything doubled under at-least-once with no uncommitted record applied, or a final run did not end
caught up.

A single-node broker is started in a temporary directory (unless KAFKA_BOOTSTRAP_SERVERS is set);
case 3 always starts a broker of its own, since it stops and restarts it. Case 7 runs its workers as
the user `nobody` when run as root (root ignores file permissions).

    .venv/bin/python bench/bench_faults.py                              # every case once, a few minutes
    .venv/bin/python bench/bench_faults.py --cases 1,2 --repetitions 3 --kills 50 --orders 100000
    .venv/bin/python bench/bench_faults.py --cases 4,5,6,7 --orders 2000   # a quick look
    .venv/bin/python bench/bench_faults.py --seeds 20 --orders 4000 --kills 10  # the soak
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))  # the harness and the cases live with the tests

from faults.harness import FaultResult, RestartableBroker  # noqa: E402
from faults.scenarios import (  # noqa: E402
    AT_LEAST_ONCE,
    EXACTLY_ONCE,
    UNCOMMITTED_APPLIED,
    Lab,
    ReadOnlyMoment,
    alternating_kills,
    broker_outage,
    corrupted_store,
    evicted_member_fenced,
    read_only_state,
    recreated_changelog,
    retention_cut,
    shadowed_corruption,
    sigkill_storm,
    windowed_sigkill_storm,
    zombie_fenced,
)

from dagster_stateful.local_kafka.broker import LocalKafkaBroker  # noqa: E402

CASES = ("1", "2", "3", "4", "5", "6", "7", "1e", "8e", "9e")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case numbers (default: all)")
    parser.add_argument("--repetitions", type=int, default=1, help="runs of each case")
    parser.add_argument("--orders", type=int, default=20_000, help="orders of case 1 (cases 3-7 use a quarter)")
    parser.add_argument("--customers", type=int, default=600)
    parser.add_argument("--partitions", type=int, default=3, help="source partitions (case 2 uses one more)")
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs of case 1")
    parser.add_argument("--alternating-kills", type=int, default=8, help="SIGKILLs of case 2 (A and B in turn)")
    parser.add_argument("--feed-rate", type=float, default=400.0, help="orders/s produced during case 2")
    parser.add_argument("--outage-seconds", type=float, default=0.0, help="least broker downtime in case 3")
    parser.add_argument("--damage-rounds", type=int, default=2, help="stores damaged in turn in case 4")
    parser.add_argument("--cut", type=int, default=200, help="orders case 6 deletes past the committed offset")
    parser.add_argument("--seed", type=int, default=None, help="seed of the random choices (default: random)")
    parser.add_argument("--seeds", type=int, default=0, help="run the soak: every storm N times per guarantee")
    parser.add_argument("--storms", default=",".join(STORMS), help="the soak's storms, comma-separated (default: all)")
    parser.add_argument(
        "--guarantees", default=",".join(GUARANTEES), help="the soak's guarantees, comma-separated (default: both)"
    )
    parser.add_argument("--log-level", default="WARNING")
    return parser.parse_args()


def print_settings(args: argparse.Namespace, cases: list[str], seed: int, external: str | None) -> None:
    print("== machine")
    print(f"cpu_count: {os.cpu_count()}; {platform.platform()}; Python {sys.version.split()[0]}")
    print(f"load avg:  {' / '.join(f'{x:.2f}' for x in os.getloadavg())} (1/5/15 min; other work skews the seconds)")
    print("== settings")
    if args.seeds:
        print(f"soak:         {args.seeds} seeds of storms {args.storms} under {args.guarantees}; seed {seed}")
    else:
        print(f"cases:        {', '.join(cases)}; repetitions {args.repetitions}; seed {seed}")
    print(
        f"case 1:       {args.orders:,} orders, {args.customers} customers, {args.partitions} partitions, "
        f"{args.kills} kills (mid-batch, mid-restore, three points inside the commit, about equally often; "
        "local state deleted before every mid-restore kill and a quarter of the others)"
    )
    print(
        f"case 2:       {args.alternating_kills} kills of workers A and B in turn, {args.partitions + 1} partitions, "
        f"orders fed at {args.feed_rate:.0f}/s while killing"
    )
    print(
        f"case 3:       {args.orders // 4:,} orders; the broker is stopped (down at least {args.outage_seconds:g} s; "
        "its restart takes longer than the 3 s session timeout) while a patient worker (admin timeout 120 s) "
        "processes and an impatient one (3 s) restores; one more impatient worker starts during the outage"
    )
    print(
        f"cases 4-7:    {args.orders // 4:,} orders each; case 4 damages the newest SST of {args.damage_rounds} "
        "store partition(s) in turn, then (apart) the oldest SST of a partition with three, which newer files "
        f"shadow; case 6 deletes {args.cut} orders past the committed offset"
    )
    print(
        "workers:      commit every 200 messages or 0.5 s, restore batches of 100, session timeout 1.5 s "
        "(cases 1-2) or 3 s, changelog compaction segment.ms=300, min.cleanable.dirty.ratio=0.01, "
        "delete.retention.ms=100"
    )
    print(f"kafka:        {external or 'a local broker started for this run'} (case 3: its own broker)")


def run_cases(
    args: argparse.Namespace, cases: list[str], bootstrap: str, scratch: Path, seed: int
) -> dict[str, list[FaultResult]]:
    small = max(1000, args.orders // 4)
    results: dict[str, list[FaultResult]] = {}
    rng = random.Random(seed)
    for repetition in range(args.repetitions):
        for case in cases:
            work = scratch / f"case{case}-{repetition}"
            work.mkdir(parents=True)
            lab = Lab(bootstrap, work, rng.randrange(2**32))
            began = time.monotonic()
            found = _run_case(case, args, lab, small, work)
            for result in found:
                results.setdefault(result.case, []).append(result)
            print(f"   case {case} run {repetition + 1}: {time.monotonic() - began:.0f} s", flush=True)
    return results


def _run_case(case: str, args: argparse.Namespace, lab: Lab, small: int, work: Path) -> list[FaultResult]:
    if case == "3":
        broker = RestartableBroker(work / "kafka")
        own = Lab(broker.start(), work, lab.seed)
        try:
            return broker_outage(own, broker, orders=small, outage_seconds=args.outage_seconds)
        finally:
            broker.stop()
    if case == "4":
        return [
            corrupted_store(lab, small, args.customers, args.partitions, args.damage_rounds),
            shadowed_corruption(lab, small, args.customers, args.partitions),
        ]
    if case == "7":
        return [read_only_state(lab, moment, orders=small) for moment in ReadOnlyMoment]
    runners: dict[str, Callable[[], FaultResult]] = {
        "1": lambda: sigkill_storm(lab, args.orders, args.customers, args.partitions, args.kills),
        "2": lambda: alternating_kills(
            lab, args.alternating_kills, args.customers, args.partitions + 1, args.feed_rate
        ),
        "5": lambda: recreated_changelog(lab, small, args.customers, args.partitions),
        "6": lambda: retention_cut(lab, small, args.customers, args.partitions, args.cut),
        "1e": lambda: sigkill_storm(
            lab, args.orders, args.customers, args.partitions, args.kills, guarantee=EXACTLY_ONCE
        ),
        "8e": lambda: zombie_fenced(lab, small, args.customers, args.partitions),
        "9e": lambda: evicted_member_fenced(lab, small, args.customers, args.partitions),
    }
    return [runners[case]()]


STORMS = ("1", "1w", "2", "3")
GUARANTEES = (AT_LEAST_ONCE, EXACTLY_ONCE)


def run_soak(args: argparse.Namespace, bootstrap: str, scratch: Path, seed: int) -> list[tuple[str, int, FaultResult]]:
    """Every storm `args.seeds` times under each guarantee, each with a fresh seed: (guarantee, seed, result)."""
    rng = random.Random(seed)
    rows: list[tuple[str, int, FaultResult]] = []
    storms = _chosen(args.storms, STORMS, "storm")
    guarantees = _chosen(args.guarantees, GUARANTEES, "guarantee")
    for round_ in range(args.seeds):
        for storm in storms:
            for guarantee in guarantees:
                run_seed = rng.randrange(2**32)
                work = scratch / f"soak-{storm}-{guarantee}-{round_}"
                work.mkdir(parents=True)
                began = time.monotonic()
                for result in _run_storm(storm, guarantee, args, Lab(bootstrap, work, run_seed), work):
                    rows.append((guarantee, run_seed, result))
                    print(
                        f"   round {round_ + 1} storm {storm} {guarantee} seed {run_seed}: {result.case}: "
                        f"{result.faults} faults, lost {result.lost}, doubled {result.doubled}, "
                        f"final run {'caught up' if final_run_ok(result) else 'NOT CAUGHT UP'} "
                        f"({time.monotonic() - began:.0f} s)",
                        flush=True,
                    )
    return rows


def _chosen(listed: str, known: Sequence[str], what: str) -> list[str]:
    chosen = [item.strip() for item in listed.split(",") if item.strip()]
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        raise SystemExit(f"unknown {what}(s) {unknown}; choose among {', '.join(known)}")
    return chosen


def _run_storm(storm: str, guarantee: str, args: argparse.Namespace, lab: Lab, work: Path) -> list[FaultResult]:
    small = max(1000, args.orders // 4)
    if storm == "3":
        broker = RestartableBroker(work / "kafka")
        own = Lab(broker.start(), work, lab.seed)
        try:
            return broker_outage(own, broker, orders=small, outage_seconds=args.outage_seconds, guarantee=guarantee)
        finally:
            broker.stop()
    if storm == "1w":
        return [windowed_sigkill_storm(lab, orders=args.orders, kills=args.kills, guarantee=guarantee)]
    if storm == "2":
        kills, customers, partitions = args.alternating_kills, args.customers, args.partitions + 1
        return [alternating_kills(lab, kills, customers, partitions, args.feed_rate, guarantee=guarantee)]
    return [sigkill_storm(lab, args.orders, args.customers, args.partitions, args.kills, guarantee=guarantee)]


def print_soak(rows: list[tuple[str, int, FaultResult]]) -> bool:
    header = (
        "storm",
        "guarantee",
        "seed",
        "faults",
        "messages",
        "state wiped",
        "compacted away",
        "uncommitted applied",
        "lost",
        "doubled",
        "final run",
    )
    table = []
    healthy = True
    for guarantee, seed, result in rows:
        ok = final_run_ok(result)
        applied = result.counters.get(UNCOMMITTED_APPLIED, 0)
        exact = result.doubled == 0 or (guarantee == AT_LEAST_ONCE and applied > 0)
        healthy = healthy and ok and exact and result.lost == 0 and not result.totals_short
        table.append(
            (
                result.case,
                guarantee,
                str(seed),
                str(result.faults),
                f"{result.messages:,}",
                str(result.counters.get("state deleted before a restart", 0)),
                str(result.counters.get("changelog records compacted away", 0)),
                str(applied),
                str(result.lost),
                str(result.doubled),
                "caught up" if ok else "NOT CAUGHT UP",
            )
        )
    _print_rows("soak", header, table)
    return healthy


def final_run_ok(result: FaultResult) -> bool:
    """The run that settled the case ended caught up with no lag by Kafka's committed offsets."""
    last = result.runs[-1] if result.runs else None
    return last is not None and last.error is None and last.stop_reason == "caught_up" and last.lag == 0


def print_table(results: dict[str, list[FaultResult]]) -> bool:
    header = (
        "case",
        "faults injected",
        "messages",
        "lost",
        "doubled",
        "outputs missing / doubled",
        "recovery s (median / max)",
        "final run",
    )
    rows = []
    healthy = True
    for case, found in results.items():
        recoveries = [r.recovery_seconds for r in found]
        ok = all(final_run_ok(r) for r in found)
        lost, doubled = sum(r.lost for r in found), sum(r.doubled for r in found)
        healthy = healthy and ok and lost == 0 and not any(r.totals_short for r in found)
        outputs = "-"
        if "exactly-once" in case:
            missing = sum(r.counters.get("outputs missing", 0) for r in found)
            repeated = sum(r.counters.get("outputs doubled", 0) for r in found)
            outputs = f"{missing} / {repeated}"
            healthy = healthy and doubled == 0 and missing == 0 and repeated == 0
        rows.append(
            (
                case,
                str(sum(r.faults for r in found)),
                f"{sum(r.messages for r in found):,}",
                str(lost),
                str(doubled),
                outputs,
                f"{statistics.median(recoveries):.1f} / {max(recoveries):.1f}",
                "caught up, lag 0" if ok else "NOT CAUGHT UP",
            )
        )
    _print_rows("results", header, rows)
    return healthy


def _print_rows(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A section titled `title`: `header`, a rule, then `rows`, each column as wide as its widest cell."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    print(f"\n== {title}")
    print(" | ".join(cell.ljust(width) for cell, width in zip(header, widths, strict=True)))
    print("-+-".join("-" * width for width in widths))
    for row in rows:
        print(" | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


def print_findings(results: dict[str, list[FaultResult]]) -> None:
    print("\n== what each case found")
    for case, found in results.items():
        print(f"{case}:")
        points: dict[str, int] = {}
        counters: dict[str, int] = {}
        for result in found:
            for point, count in result.points.items():
                points[point] = points.get(point, 0) + count
            for name, value in result.counters.items():
                counters[name] = counters.get(name, 0) + value
        if points:
            print("   kills landed: " + "; ".join(f"{point} x{count}" for point, count in sorted(points.items())))
        if counters:
            print("   " + "; ".join(f"{name}: {value}" for name, value in counters.items()))
        for result in found:
            for run in result.runs:
                if run.error is not None:
                    print(f"   {run.label}: stopped with {run.error.type}: {_first_line(run.error.message)}")
            for change in result.changed_by_failed_run:
                print(f"   COMMITTED BY A FAILED RUN: {change}")
            for route, comparison in result.side_routes.items():
                print(f"   side route {route}: lost {comparison.lost}, doubled {comparison.doubled}")
            if result.totals_short:
                print(f"   customers with a short total: {list(result.totals_short)[:10]}")
            if result.missed_by_iteration:
                print(f"   customers the store's iteration misses: {len(result.missed_by_iteration)}")
            for note in result.notes:
                print(f"   {note}")


def _first_line(message: str, limit: int = 220) -> str:
    line = message.splitlines()[0] if message else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def main() -> int:
    args = parse_args()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cases = [case.strip() for case in args.cases.split(",") if case.strip()]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; the cases are {', '.join(CASES)}")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    print_settings(args, cases, seed, external)
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as scratch_name:
        scratch = Path(scratch_name)
        broker = None
        try:
            if external:
                bootstrap = external
            else:
                broker = LocalKafkaBroker(scratch / "kafka")
                began = time.monotonic()
                bootstrap = broker.start(tie_to_parent=True)
                print(f"broker: {bootstrap} started in {time.monotonic() - began:.1f} s")
            print("== running (each case's own time)")
            if args.seeds:
                soak = run_soak(args, bootstrap, scratch, seed)
            else:
                results = run_cases(args, cases, bootstrap, scratch, seed)
        finally:
            if broker is not None:
                broker.stop()
    if args.seeds:
        healthy = print_soak(soak)
        print_findings({f"{result.case} seed {run_seed}": [result] for _, run_seed, result in soak})
    else:
        healthy = print_table(results)
        print_findings(results)
    if not healthy:
        print("\nFAILED: an order was lost, or a final run did not end caught up with no lag (see above)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
