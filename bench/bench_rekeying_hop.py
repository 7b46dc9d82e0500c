"""CPU per record of a re-keying app's source hop (`paths.rekeying.Rekeying.process`), without Kafka.

The hop reads each source record, decodes its value, takes its new key (`group_by("region")`) and
hands the record to the producer (here a function that only counts it), so the figure is the
engine's own cost per record, the part of bench_compare's "group_by" workload that profiles showed
dominant. Orders as bench_compare's (customer, region, amount); `--with-step` adds a stateless step
before `group_by`, which makes the hop encode the value again. Prints microseconds per record, the
best of `--repeat` passes over `--records` records, and the settings.

    .venv/bin/python bench/bench_rekeying_hop.py
    .venv/bin/python bench/bench_rekeying_hop.py --records 500000 --with-step
"""

from __future__ import annotations

import argparse
import tempfile
import time

import orjson
from confluent_kafka import Message, TopicPartition

from dagster_stateful.core import App, Sum
from dagster_stateful.core.processing.paths.bad_input import BadInputHandler
from dagster_stateful.core.processing.paths.rekeying import Rekeying


def hop(state_dir: str, with_step: bool) -> tuple[Rekeying, list[int]]:
    app = App(name="hop", source="orders", stores=["totals"], state_dir=state_dir)
    frame = app.dataframe()
    if with_step:
        frame.apply(lambda order: {**order, "checked": True})
    frame.group_by("region").aggregate(Sum("amount"))
    sent: list[int] = []

    def produce(*_record: object) -> None:
        sent.append(1)

    bad_input = BadInputHandler(app.config.on_error, produce, app.config.dead_letter_topic)
    grouping = app._dataframe.grouping
    assert grouping is not None
    rekeying = Rekeying(app.config, grouping, bad_input, produce, {})
    rekeying.take([TopicPartition("orders", 0, 0)], None)
    return rekeying, sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--with-step", action="store_true", help="a stateless step before group_by")
    args = parser.parse_args()
    records = [
        Message(
            topic="orders",
            partition=0,
            offset=i,
            key=f"c{i % 1000}".encode(),
            value=orjson.dumps({"customer": f"c{i % 1000}", "region": f"r{i % 7}", "amount": i % 5}),
            timestamp=(1, 1_000 + i),
        )
        for i in range(args.records)
    ]
    with tempfile.TemporaryDirectory() as state_dir:
        rekeying, sent = hop(state_dir, args.with_step)
        best = float("inf")
        for _ in range(args.repeat):
            sent.clear()
            started = time.perf_counter()
            rekeying.process(records, 0, len(records), len(records))
            best = min(best, time.perf_counter() - started)
            assert len(sent) == len(records), "every record is sent on"
    print(
        f"re-keying hop: {best / len(records) * 1e6:.2f} us/record (best of {args.repeat} passes over "
        f"{len(records)} records; step before group_by: {'yes' if args.with_step else 'no'})"
    )


if __name__ == "__main__":
    main()
