"""Quix Streams on the benchmark's running-total workload: one measured run, its figures in a JSON file.

Owns the Quix side of the side-by-side benchmark. Runs with the Quix venv's python (see
bench/quix_venv.py), so it uses the standard library and quixstreams only (not dagster_stateful,
which that venv does not have; confluent_kafka is the one quixstreams brings).

The app: the source topic holds JSON orders {"customer": "c<k>", "amount": <int>, ...} keyed by
the customer (str key). `sdf.apply(running_total, stateful=True, metadata=True)` keeps a running
total per key in Quix's default RocksDB store (with its changelog topic):
`total = state.get("total", 0) + value["amount"]; state.set("total", total)`. No output topic.
Settings as the engine's bench: commit_interval --commit-interval (5 s), auto_offset_reset
"earliest", at-least-once, consumer group --group, state in --state-dir; the rest is Quix's default.

The callback also keeps a plain dict key -> last total, written to the result as "totals" so the
caller can check them. It gets the key as an argument (metadata=True): Quix runs every stateful
callback through its metadata form anyway (without metadata=True it adds a wrapper that drops the
key), so this is one call fewer than the plain form, and cheaper than `message_key()`, which reads
a context variable per message.

Modes:
- process: the clock starts right before `app.run()` (group join and assignment included); the
  callback counts messages and calls `app.stop()` at the --messages'th. "seconds" is until then,
  "seconds_closed" until `app.run()` returned (after its final commit).
- restore: run after a process run of the same group whose state dir was deleted since, with
  --messages new orders appended to the source. Quix restores the store from its changelog on
  assignment, then processes the new orders. "seconds_until_processing" is until the first of
  them went through the callback (restore done, processing resumed), "seconds" until all did.
  "restored_records" counts the changelog records the restore read, "restore_seconds" is the time
  spent in Quix's RecoveryManager.do_recovery (from "Beginning recovery check" to "Recovery process
  complete": it includes Quix's wait of at least one empty 1 s poll before it declares a partition
  done), "seconds_until_restore_started" / "seconds_until_restore_read" are until the first / the
  last changelog record was read. Quix has no restore listener: these come from wrapping two of its
  internal methods (see RestoreProbe), and are null if those are gone. "changelog_span" is
  sum(high - low watermark) over the changelog's partitions, read before the run: compaction may
  have removed records inside that span, so it is an upper bound of what a restore reads. The
  totals of the keys touched must include the restored state.

Result JSON (--result); "seconds*" are from just before `app.run()`, the other times are durations:
    {"mode": "process"|"restore", "quixstreams": version, "group", "source", "commit_interval",
     "messages": N (messages through the callback), "seconds_until_processing" (first message),
     "seconds" (N-th message), "seconds_closed" (app.run() returned), "cpu_seconds" (user + system
     CPU of the whole process during app.run(): a figure less bent by a busy machine), "peak_rss_mib"
     (ru_maxrss / 1024), process mode: "messages_per_second" (N / seconds), restore mode:
     "restored_records", "restore_seconds", "changelog_span", "seconds_until_restore_started",
     "seconds_until_restore_read" (any of these may be null), "complete" (true in process mode:
     "totals" holds every key of the store; false in restore mode: only the keys of the new
     messages), "totals": {key: last total}}

Usage (with the Quix venv's python):
    python bench/quix/quix_totals.py --bootstrap 127.0.0.1:9092 --source orders --group quix-1 \\
        --state-dir /tmp/quix-state --messages 100000 --result /tmp/quix.json [--mode restore]
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import resource
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import quixstreams
from confluent_kafka import Consumer, TopicPartition  # type: ignore[import-untyped]
from quixstreams import Application
from quixstreams.state import State

log = logging.getLogger("quix_totals")

STATE_KEY = "total"
STORE_NAME = "default"
METADATA_TIMEOUT = 30.0


class RunningTotal:
    """The stateful callback: updates the key's total, mirrors it, counts, stops the app at the target."""

    def __init__(self, target: int, stop: Callable[[], None]) -> None:
        self.target = target
        self.stop = stop
        self.count = 0
        self.first_at: float | None = None
        self.done_at: float | None = None
        self.totals: dict[str, int] = {}

    def __call__(self, value: dict[str, Any], key: str, _timestamp: int, _headers: Any, state: State) -> int:
        total = state.get(STATE_KEY, 0) + value["amount"]
        state.set(STATE_KEY, total)
        self.totals[key] = total
        self.count += 1
        if self.count == 1:
            self.first_at = time.monotonic()
        if self.count >= self.target and self.done_at is None:
            self.done_at = time.monotonic()
            self.stop()
        return total


class RestoreProbe:
    """What Quix's recovery did: changelog records read, when the first and the last were read, and
    the seconds spent in RecoveryManager.do_recovery. Quix has no restore listener, so this wraps
    two of its internal methods (RecoveryPartition.recover_from_changelog_message, per record, and
    RecoveryManager.do_recovery); `installed` is False if they are not there."""

    def __init__(self) -> None:
        self.records = 0
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.recovery_seconds = 0.0
        self.installed = False

    def install(self) -> None:
        from quixstreams.state import recovery

        read_record = getattr(recovery.RecoveryPartition, "recover_from_changelog_message", None)
        do_recovery = getattr(recovery.RecoveryManager, "do_recovery", None)
        if read_record is None or do_recovery is None:
            log.warning("quixstreams' recovery has changed: not measuring the restore")
            return

        @functools.wraps(read_record)
        def counting(partition: Any, changelog_message: Any) -> Any:
            self.last_at = time.monotonic()
            if self.first_at is None:
                self.first_at = self.last_at
            self.records += 1
            return read_record(partition, changelog_message)

        @functools.wraps(do_recovery)
        def timed(manager: Any) -> Any:
            began = time.monotonic()
            try:
                return do_recovery(manager)
            finally:
                self.recovery_seconds += time.monotonic() - began

        recovery.RecoveryPartition.recover_from_changelog_message = counting  # type: ignore[method-assign,assignment]
        recovery.RecoveryManager.do_recovery = timed  # type: ignore[method-assign]
        self.installed = True


def changelog_topic(group: str, source: str) -> str:
    """The changelog topic Quix uses for the default store on `source` (its internal naming)."""
    return f"changelog__{group}--{source}--{STORE_NAME}"


def watermark_span(bootstrap: str, topic: str) -> int | None:
    """sum(high - low) over the topic's partitions, or None when there is no such topic."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "quix-totals-watermarks"})
    try:
        metadata = consumer.list_topics(timeout=METADATA_TIMEOUT).topics.get(topic)
        if metadata is None:
            log.warning("No topic %s on the broker: no changelog span", topic)
            return None
        span = 0
        for partition in metadata.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=METADATA_TIMEOUT)
            span += high - low
        return span
    finally:
        consumer.close()


def make_app(args: argparse.Namespace) -> Application:
    return Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        state_dir=args.state_dir,
        commit_interval=args.commit_interval,
        auto_offset_reset="earliest",
        loglevel=None,  # logging is configured in main(): one handler for Quix and this script
    )


def since(began: float, moment: float | None) -> float | None:
    return None if moment is None else moment - began


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds() -> float:
    """User + system CPU time of this process so far (all its threads, librdkafka's included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One measured run; returns the result document."""
    app = make_app(args)
    callback = RunningTotal(args.messages, app.stop)
    source = app.topic(args.source, value_deserializer="json", key_deserializer="str")
    app.dataframe(source).apply(callback, stateful=True, metadata=True)

    restore_probe = RestoreProbe()
    span: int | None = None
    if args.mode == "restore":
        span = watermark_span(args.bootstrap, changelog_topic(args.group, args.source))
        restore_probe.install()

    watchdog = threading.Timer(args.timeout, app.stop)
    watchdog.daemon = True
    watchdog.start()
    cpu_began = cpu_seconds()
    began = time.monotonic()
    try:
        app.run()
    finally:
        watchdog.cancel()
    closed = time.monotonic()
    cpu_used = cpu_seconds() - cpu_began

    if callback.done_at is None or callback.first_at is None:
        raise SystemExit(
            f"quix_totals: only {callback.count} of {args.messages} messages were processed "
            f"(the app stopped after {closed - began:.1f} s; --timeout is {args.timeout} s)"
        )
    seconds = callback.done_at - began
    result: dict[str, Any] = {
        "mode": args.mode,
        "quixstreams": quixstreams.__version__,
        "group": args.group,
        "source": args.source,
        "commit_interval": args.commit_interval,
        "messages": callback.count,
        "seconds_until_processing": callback.first_at - began,
        "seconds": seconds,
        "seconds_closed": closed - began,
        "cpu_seconds": cpu_used,
        "peak_rss_mib": peak_rss_mib(),
    }
    if args.mode == "process":
        result["messages_per_second"] = callback.count / seconds if seconds > 0 else None
    else:
        probed = restore_probe.installed
        result["restored_records"] = restore_probe.records if probed else None
        result["restore_seconds"] = restore_probe.recovery_seconds if probed else None
        result["seconds_until_restore_started"] = since(began, restore_probe.first_at)
        result["seconds_until_restore_read"] = since(began, restore_probe.last_at)
        result["changelog_span"] = span
    # Every key of the store went through the callback in a process run; a restore run sees only
    # the keys of the new messages.
    result["complete"] = args.mode == "process"
    result["totals"] = callback.totals
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    parser.add_argument("--source", required=True, help="the source topic of JSON orders")
    parser.add_argument("--group", required=True, help="the consumer group (also names the changelog topic)")
    parser.add_argument("--state-dir", required=True, type=Path, help="Quix's state directory")
    parser.add_argument(
        "--messages", required=True, type=int, help="stop after this many messages (restore: the new ones)"
    )
    parser.add_argument("--commit-interval", type=float, default=5.0, help="seconds between commits (5.0)")
    parser.add_argument("--result", required=True, type=Path, help="where to write the result JSON")
    parser.add_argument("--mode", choices=("process", "restore"), default="process")
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="stop and fail if not done after this many seconds (900)"
    )
    parser.add_argument("--loglevel", default="WARNING", help="level of quixstreams' own logs (WARNING)")
    args = parser.parse_args(argv)
    if args.messages < 1:
        parser.error("--messages must be at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("quixstreams").setLevel(args.loglevel.upper())
    result = run(args)
    args.result.parent.mkdir(parents=True, exist_ok=True)
    args.result.write_text(json.dumps(result))
    summary = {key: value for key, value in result.items() if key != "totals"}
    print(f"quix_totals: {json.dumps(summary)} ({len(result['totals'])} keys) -> {args.result}")


if __name__ == "__main__":
    main()
