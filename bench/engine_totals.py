"""This engine's side of bench_compare.py: a keyed running total, run in a process of its own.

The same computation as bench/quix/quix_totals.py and bench/kafka-streams: the JSON "amount" of each
order added to a total per message key, in store "totals" with its changelog, no output topic, the
app's defaults except the commit interval. With --aggregate the total is kept by the columnar
`aggregate(Sum("amount"))`, folded a consumed batch at a time (the like-for-like of Kafka Streams'
`groupByKey().aggregate()`) instead of a stateful `update` reading and writing it. With
--group-by FIELD the orders are first re-keyed by that field of their value (`group_by(FIELD)`: the
engine writes them under the new key to its repartition topic `<group>-<FIELD>-repartition` and reads
them back into the total, Kafka Streams' `groupBy().aggregate()`), so the totals are per value of the
field, and "seconds" covers both hops. With --join-table TOPIC each order is first joined (inner,
`on_merge="keep-left"`) with the table of that compacted topic ("customers": its JSON row's fields,
e.g. "tier", added to the order), before --group-by: with --join-kind table (the default) a
partitioned table on the message key, `app.table(TOPIC, name="customers")` (Kafka Streams' KTable;
the topic co-partitioned with the source), with --join-kind global a global table looked up by the
order's "customer" field, `app.global_table(TOPIC, name="customers")` (Kafka Streams' GlobalKTable).
With --session-gap MS the amounts are totalled per key and session of activity instead
(`session_window(MS, grace=--session-grace, retention=--session-retention)` with `Sum("amount")`,
emitting `final()` with no output topic: Kafka Streams' `windowedBy(SessionWindows)`), and each
session is read back as `"<key>@<start>-<end>": total`. It runs one
bounded worker until caught up: from the start of the source the first time; run again after the
caller deleted the local state and appended messages, the worker first restores the store from its
changelog (the report's restores say how many records; the restores' span, first start to last
end, how long), then processes what was
appended. The whole store is then read back and written, with the timings, as JSON to `--result`:

    {"messages", "seconds", "seconds_closed", "seconds_until_processing", "restored_records",
     "restore_seconds", "rekeyed", "totals": {key: total}}

("rekeyed": the source messages sent on to the repartition topic, with --group-by; else 0.)

"seconds" runs from just before the worker starts (group join included, as for the other
systems) until its loop saw it was caught up; "seconds_closed" until run_worker returned (final
commit and close); "seconds_until_processing" until the worker entered RUNNING (partitions
assigned and restored). With --profile the worker runs under cProfile (slower), and the JSON also
has "profile": where its time went, as text. Run from the repository root with the project's venv:

    .venv/bin/python bench/engine_totals.py --bootstrap 127.0.0.1:9092 --source orders \\
        --partitions 6 --group bench-engine-1 --state-dir /tmp/state --messages 1000000 \
        --result /tmp/engine.json
"""

from __future__ import annotations

import argparse
import cProfile
import time
from pathlib import Path

import orjson

from dagster_stateful.core import App, AppState, RestoreListener, State, Sum
from dagster_stateful.core.state.keys import split_store_key

STORE = "totals"
JOIN_TABLE = "customers"
TOTAL = "total"
"""The state key of each message key's total (the aggregation's name with --aggregate)."""


class RestoreClock(RestoreListener):
    """When the first restore started and the last one ended (monotonic seconds): restores that run
    at once are timed by their span, as Kafka Streams' side is (first onRestoreStart to last onRestoreEnd)."""

    def __init__(self) -> None:
        self.first_start: float | None = None
        self.last_end: float | None = None

    def on_restore_start(self, partition: int, store: str, start_offset: int, end_offset: int) -> None:
        if self.first_start is None:
            self.first_start = time.monotonic()

    def on_restore_end(self, partition: int, store: str, total_restored: int) -> None:
        self.last_end = time.monotonic()

    @property
    def seconds(self) -> float:
        """From the first restore's start to the last one's end (0.0 if nothing was restored)."""
        if self.first_start is None or self.last_end is None:
            return 0.0
        return self.last_end - self.first_start


def add_to_total(order: dict, state: State) -> None:
    state.set(TOTAL, state.get(TOTAL, 0) + order["amount"])


def make_app(args: argparse.Namespace) -> App:
    app = App(
        name=args.group,
        source=args.source,
        stores=[STORE],
        state_dir=args.state_dir,
        kafka=args.bootstrap,
        commit_interval=args.commit_interval,
        consumer_config=dict(args.consumer_setting) or None,
    )
    orders = app.dataframe()
    if args.session_gap:
        sessions = orders.session_window(args.session_gap, grace=args.session_grace, retention=args.session_retention)
        sessions.aggregate(Sum("amount"), name=TOTAL).final()
        return app
    if args.join_table is not None:
        if args.join_kind == "global":
            customers = app.global_table(args.join_table, name=JOIN_TABLE)
            orders = orders.join(customers, on="customer", how="inner", on_merge="keep-left")
        else:
            profiles = app.table(args.join_table, name=JOIN_TABLE)
            orders = orders.join(profiles, how="inner", on_merge="keep-left")
    if args.group_by is not None:
        orders = orders.group_by(args.group_by)
    if args.aggregate:
        orders.aggregate(Sum("amount"), name=TOTAL)
    else:
        orders.update(add_to_total, stateful=True)
    return app


def read_totals(app: App, partitions: int, sessions: bool = False) -> dict[str, int]:
    """Every message key's total in the store (re-keyed: every new key's; the repartition topic has the
    source's partition count); with `sessions`, every session's, as `"<key>@<start>-<end>"`."""
    if sessions:
        with app.read_state(STORE) as reader:
            return {f"{s.message_key}@{s.start}-{s.end}": s.value for s in reader.windows()}
    totals: dict[str, int] = {}
    for partition in range(partitions):
        part = app.state.partition(STORE, partition)
        if not part.path.exists():
            continue
        part.open()
        try:
            for key, value in part.items():
                message_key, state_key = split_store_key(key)
                if state_key == TOTAL.encode():
                    totals[message_key.decode()] = orjson.loads(value)
        finally:
            part.close()
    return totals


def run(args: argparse.Namespace) -> dict:
    app = make_app(args)
    entered: dict[AppState, float] = {}

    def note(new: AppState, old: AppState) -> None:
        entered.setdefault(new, time.monotonic())

    app.add_state_listener(note)
    restores = RestoreClock()
    app.add_restore_listener(restores)
    profiler = cProfile.Profile() if args.profile else None
    began = time.monotonic()
    if profiler is not None:
        profiler.enable()
    report = app.run_worker(until_caught_up=True)
    if profiler is not None:
        profiler.disable()
    closed = time.monotonic() - began
    rekeyed = sum(report.rekeyed.values())
    if report.total_processed != args.messages or report.total_lag:
        raise SystemExit(
            f"FAILED: the worker processed {report.total_processed:,} of {args.messages:,} messages "
            f"(lag left {report.total_lag}, stop reason {report.stop_reason})"
        )
    if args.group_by is not None and rekeyed != args.messages:
        raise SystemExit(f"FAILED: the worker re-keyed {rekeyed:,} of {args.messages:,} messages")
    loop_done = entered.get(AppState.PENDING_SHUTDOWN, began + closed) - began
    running = entered.get(AppState.RUNNING)
    return {
        "messages": report.total_processed,
        "seconds": loop_done,
        "seconds_closed": closed,
        "seconds_until_processing": None if running is None else running - began,
        "restored_records": sum(restore.records_applied for restore in report.restores),
        "restore_seconds": restores.seconds,
        "rekeyed": rekeyed,
        "totals": read_totals(app, args.partitions, sessions=bool(args.session_gap)),
        **({"profile": profile_of(profiler, args.group)} if profiler is not None else {}),
    }


def profile_of(profiler: cProfile.Profile, group: str) -> str:
    from bench_core import profile_text  # imports the broker's tooling: only when profiling

    return profile_text(profiler, f"the worker of {group}", top=20)


def consumer_setting(text: str) -> tuple[str, str]:
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--group", required=True, help="the app's name (its consumer group and topics' prefix)")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--messages", type=int, required=True, help="messages this run must process")
    parser.add_argument("--commit-interval", type=float, default=5.0, help="seconds")
    parser.add_argument("--partitions", type=int, required=True, help="of the source topic")
    parser.add_argument("--result", type=Path, required=True, help="where the JSON result is written")
    parser.add_argument("--aggregate", action="store_true", help='keep the totals with aggregate(Sum("amount"))')
    parser.add_argument(
        "--group-by", metavar="FIELD", help="re-key the orders by this field of the value first (group_by(FIELD))"
    )
    parser.add_argument(
        "--join-table", metavar="TOPIC", help="join each order with the table of this compacted topic first (inner)"
    )
    parser.add_argument(
        "--join-kind",
        choices=("table", "global"),
        default="table",
        help="with --join-table: a partitioned table on the message key (App.table) or a global table on the "
        'order\'s "customer" field (App.global_table)',
    )
    parser.add_argument(
        "--consumer-setting",
        type=consumer_setting,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a librdkafka setting of the worker's consumer over the app's (repeatable), e.g. "
        "max.partition.fetch.bytes=2097152",
    )
    parser.add_argument("--session-gap", type=int, default=0, metavar="MS", help="total per session of activity")
    parser.add_argument("--session-grace", type=int, default=0, metavar="MS")
    parser.add_argument("--session-retention", type=int, default=2 * 3600 * 1000, metavar="MS")
    parser.add_argument("--profile", action="store_true", help="run the worker under cProfile (slower)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    args.result.write_bytes(orjson.dumps(run(args)))


if __name__ == "__main__":
    main()
