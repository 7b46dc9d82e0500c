"""How cost grows with the work: throughput and memory against distinct keys, restore time against
store size, this engine and Kafka Streams side by side.

What it measures, on one broker (a local one it starts, or KAFKA_BOOTSTRAP_SERVERS's), with the
runners of bench_compare.py (each system in a process of its own, every run's totals checked
against the source):

- processing: for each of --keys K, a keyed running total over max(--messages, K) JSON orders
  spread over K keys (so every key is seen at least once); messages/s and peak RSS.
- restore: for each of --restore-keys N, a store of N keys (N orders, every one a new key) built
  by each restoring system, its local state deleted, then restored from its changelog on restart
  (this engine: its full restores on every core, one group in the worker and the others in child
  processes; Kafka Streams: one stream thread). Records/s, seconds restoring, seconds until
  processing resumed, and peak RSS (this engine's children included).

- restore from a snapshot (unless --no-snapshot-paths), for each of --restore-keys N: bench_restore.py's
  paths on a changelog of N keys (one Spark session for the whole run): the local snapshot from its
  SST image (a copy and an ingest, then the changelog's tail), the same from its Parquet rows (pyarrow
  and SST files written in a process per core, then the tail), and the Spark bulk restore (Spark tasks
  write the SST files, then the tail), each checked by digest against a replay. Keys/s and
  seconds until processing could resume; their peak RSS is not measured (children and JVMs).

--keep-processing-from FILE keeps the processing points of an earlier growth.json (with --keys left
empty, only the restore curve is measured).

Output: a table on stdout (machine and settings first), and `growth.json` and `growth.png` (msg/s
and peak RSS against keys; restore seconds against store size; log scales) in --out. Run from the
repository root:

    .venv/bin/python bench/bench_growth.py                        # about 30 minutes here
    .venv/bin/python bench/bench_growth.py --keys --restore-keys 1000000 5000000 20000000 \
        --keep-processing-from bench/results/growth.json --out bench/results
    .venv/bin/python bench/bench_growth.py --keys 10000 100000 --restore-keys 100000 --messages 200000
"""

from __future__ import annotations

import argparse
import statistics
import uuid
from argparse import Namespace
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson
from bench_compare import Figure, Systems, Workload, machine, processing, restores
from bench_core import create_topic, produce_orders
from bench_restore import bench_broker, start_spark
from bench_restore import run as restore_paths

PROCESSING_SYSTEMS = ("engine-aggregate", "engine", "kafka-streams")
RESTORING_SYSTEMS = ("engine", "kafka-streams")
APPENDED = 60
"""Orders appended before each restore, processed once the store is restored."""


@dataclass
class Point:
    system: str
    curve: str
    """"processing" or "restore"."""
    keys: int
    messages: int
    rate: float
    """Messages/s (processing) or records restored per second (restore), median of runs."""
    peak_rss_mib: float | None
    """None where not measured (the snapshot paths)."""
    seconds: float
    """Seconds processing (processing) or restoring (restore), median of runs."""
    seconds_until_processing: float | None = None


def workload(bootstrap: str, keys: int, messages: int, partitions: int) -> Workload:
    topic = f"bench-growth-{keys}-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, partitions)
    seconds = produce_orders(bootstrap, topic, messages, lambda i: f"c{i % keys}")
    print(f"produced {messages:,} orders over {keys:,} keys to {topic} in {seconds:.1f} s (not measured)")
    return Workload(topic, messages, keys)


def point(figure: Figure, curve: str, load: Workload) -> Point:
    runs = figure.runs
    until = [run.seconds_until_processing for run in runs if run.seconds_until_processing is not None]
    return Point(
        figure.system,
        curve,
        load.keys,
        load.messages,
        figure.median,
        figure.median_rss,
        statistics.median(run.seconds for run in runs),
        statistics.median(until) if until else None,
    )


def processing_curve(systems: Systems, bootstrap: str, args: argparse.Namespace) -> list[Point]:
    points = []
    for keys in args.keys:
        load = workload(bootstrap, keys, max(args.messages, keys), args.partitions)
        for figure in processing(systems, args.systems, load, f"{keys}-keys", args.runs):
            points.append(point(figure, "processing", load))
    return points


def restore_curve(systems: Systems, bootstrap: str, args: argparse.Namespace) -> list[Point]:
    restoring = [system for system in args.systems if system in RESTORING_SYSTEMS]
    points = []
    for keys in args.restore_keys:
        load = workload(bootstrap, keys, keys, args.partitions)
        built = processing(systems, restoring, load, f"{keys}-keys-store", 1)
        groups = {figure.system: figure.last_group for figure in built}
        for figure in restores(systems, bootstrap, groups, load, args.runs, APPENDED, appended=[]):
            points.append(point(figure, "restore", load))
    return points


SNAPSHOT_PATHS = {
    "local snapshot": "engine-snapshot",
    "local snapshot (Parquet)": "engine-snapshot-parquet",
    "spark": "engine-spark",
}
"""bench_restore.py's paths from a snapshot, and the system each is plotted as."""


def snapshot_curve(bootstrap: str, work: Path, args: argparse.Namespace) -> list[Point]:
    """The local-snapshot and Spark restore paths (bench_restore.py) at each store size."""
    spark = start_spark("local[*]")
    points = []
    try:
        for keys in args.restore_keys:
            settings = Namespace(keys=keys, partitions=args.partitions, tail=APPENDED, load_processes=0)
            figures = restore_paths(settings, bootstrap, work, spark)
            for path, system in SNAPSHOT_PATHS.items():
                figure = figures[path]
                rate = figure.records / figure.seconds
                points.append(Point(system, "restore", keys, keys, rate, None, figure.seconds, figure.seconds))
    finally:
        spark.stop()
    return points


def kept_processing(path: Path | None) -> list[Point]:
    if path is None:
        return []
    document = orjson.loads(path.read_bytes())
    return [Point(**point) for point in document["points"] if point["curve"] == "processing"]


def print_table(points: list[Point]) -> None:
    print("\n== results (medians)")
    for curve in ("processing", "restore"):
        rows = [p for p in points if p.curve == curve]
        if not rows:
            continue
        unit = "msg/s" if curve == "processing" else "records/s"
        print(f"-- {curve}: {unit}, peak RSS" + (", seconds restoring, until processing" if curve == "restore" else ""))
        for p in rows:
            extra = ""
            if curve == "restore":
                extra = f"  {p.seconds:6.1f} s  until processing {p.seconds_until_processing or 0:6.1f} s"
            rss = "    n/a" if p.peak_rss_mib is None else f"{p.peak_rss_mib:>7,.0f}"
            print(f"{p.keys:>12,} keys  {p.system:<24} {p.rate:>12,.0f}  {rss} MiB{extra}")
        for keys in sorted({p.keys for p in rows}):
            ours = {p.system: p for p in rows if p.keys == keys}
            peer = ours.get("kafka-streams")
            for system, p in ours.items():
                if peer is not None and system != "kafka-streams":
                    print(f"{keys:>12,} keys  {system} / kafka-streams: {p.rate / peer.rate:.2f}x", end="")
                    if curve == "restore" and p.seconds_until_processing and peer.seconds_until_processing:
                        faster = peer.seconds_until_processing / p.seconds_until_processing
                        print(f"; processing resumes {faster:.2f}x as fast", end="")
                    print()


def plot(path: Path, points: list[Point]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("processing", "rate", "messages / s"),
        ("processing", "peak_rss_mib", "peak RSS (MiB)"),
        ("restore", "seconds_until_processing", "seconds until processing resumes"),
        ("restore", "peak_rss_mib", "peak RSS while restoring (MiB)"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5), squeeze=False)
    for axis, (curve, field, label) in zip(axes[0], panels, strict=True):
        rows = [p for p in points if p.curve == curve and getattr(p, field) is not None]
        for system in sorted({p.system for p in rows}):
            mine = sorted((p for p in rows if p.system == system), key=lambda p: p.keys)
            axis.plot([p.keys for p in mine], [getattr(p, field) for p in mine], marker="o", label=system)
        axis.set_xscale("log")
        axis.set_xlabel("distinct keys" if curve == "processing" else "keys in the store")
        axis.set_ylabel(label)
        axis.set_title(curve)
        axis.grid(True, which="both", linewidth=0.3)
        if rows:
            axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--keys", type=int, nargs="*", default=[10_000, 100_000, 1_000_000, 10_000_000])
    parser.add_argument("--messages", type=int, default=1_000_000, help="orders per processing point, at least")
    parser.add_argument("--restore-keys", type=int, nargs="*", default=[1_000_000, 5_000_000])
    parser.add_argument("--systems", nargs="+", choices=PROCESSING_SYSTEMS, default=list(PROCESSING_SYSTEMS))
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--commit-interval", type=float, default=5.0, help="seconds, for every system")
    parser.add_argument("--runs", type=int, default=1, help="runs per point (the median is reported)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="where the JSON and PNG go")
    parser.add_argument("--no-snapshot-paths", action="store_true", help="leave out the snapshot restore paths")
    parser.add_argument("--keep-processing-from", type=Path, help="an earlier growth.json whose processing points stay")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    print("== machine")
    for name, value in machine().items():
        print(f"{name + ':':<18}{value}")
    print("== settings")
    print(f"processing:       keys {args.keys}, max(--messages {args.messages:,}, keys) orders each, amounts 1..7")
    print(f"restore:          store sizes {args.restore_keys} keys, then {APPENDED} orders appended and processed")
    print(f"systems:          {args.systems}; runs per point {args.runs}")
    print(f"partitions:       {args.partitions}; commit interval {args.commit_interval} s")
    with bench_broker("bench-growth-") as (bootstrap, work):
        systems = Systems(bootstrap, work, args)
        systems.prepare(args.systems)
        points = kept_processing(args.keep_processing_from)
        points += processing_curve(systems, bootstrap, args)
        save(args, points)
        points += restore_curve(systems, bootstrap, args)
        save(args, points)
        if args.restore_keys and not args.no_snapshot_paths:
            points += snapshot_curve(bootstrap, work, args)
    print_table(points)
    save(args, points)
    plot(args.out / "growth.png", points)
    print(f"\nwrote {args.out / 'growth.json'} and {args.out / 'growth.png'}")


def save(args: argparse.Namespace, points: list[Point]) -> None:
    """growth.json with the points so far (a run that fails later keeps what it measured)."""
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()}
    document = {"machine": machine(), "settings": settings, "points": [asdict(p) for p in points]}
    (args.out / "growth.json").write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
