"""The least a per-message Python step costs on this machine, with no Kafka and no engine.

Over --messages pre-built JSON orders (--keys customers), three plain loops, each timed alone:

- `decode`: `orjson.loads` of each value;
- `decode + get/set step`: also a step like the benchmarks' stateful apply, `state.set("total",
  state.get("total", 0) + order["amount"])`, on the least a state can be: a dict of JSON bytes
  keyed by the message key plus the state key, with no journal, cache accounting or store;
- `decode + aggregate`: also the fold an aggregation does: one dict look-up, one call of an
  aggregator's `add`, one dict write of the object (no serializing).

It prints microseconds per message and messages per second for each, then the rate once polling
costs what bench/ceilings.py's consume-only loop measured (`--poll-us`). These are floors for any
Python engine with such a step API: the engine's own figures (bench_core.py) add polling, the
undo journal, the record cache's accounting, commits and the changelog.

    .venv/bin/python bench/step_floor.py
    .venv/bin/python bench/step_floor.py --messages 2000000 --keys 1000000
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson


class MinimalState:
    """A state reduced to what a get/set step needs: JSON bytes in a dict, scoped by a key prefix."""

    __slots__ = ("prefix", "values")

    def __init__(self) -> None:
        self.values: dict[bytes, bytes] = {}
        self.prefix = b""

    def get(self, key: str, default: Any = None) -> Any:
        data = self.values.get(self.prefix + key.encode())
        return default if data is None else orjson.loads(data)

    def set(self, key: str, value: Any) -> None:
        self.values[self.prefix + key.encode()] = orjson.dumps(value)


def add_to_total(order: dict, state: MinimalState) -> None:
    state.set("total", state.get("total", 0) + order["amount"])


def add_amount(total: int, order: dict) -> int:
    return total + order["amount"]


Orders = list[tuple[bytes, bytes]]


def decode(orders: Orders) -> None:
    loads = orjson.loads
    for _key, value in orders:
        loads(value)


def decode_and_step(orders: Orders) -> None:
    loads, state = orjson.loads, MinimalState()
    for key, value in orders:
        state.prefix = key
        add_to_total(loads(value), state)


def decode_and_aggregate(orders: Orders) -> None:
    loads = orjson.loads
    aggregates: dict[bytes, int] = {}
    for key, value in orders:
        store_key = key + b"total"
        current = aggregates.get(store_key)
        order = loads(value)
        aggregates[store_key] = order["amount"] if current is None else add_amount(current, order)


def best_seconds(loop: Callable[[Orders], None], orders: Orders, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        began = time.perf_counter()
        loop(orders)
        best = min(best, time.perf_counter() - began)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3, help="each loop runs this often; the best counts")
    parser.add_argument(
        "--poll-us", type=float, default=1.52, help="µs per message of consuming alone (ceilings.py: 659k msg/s)"
    )
    args = parser.parse_args()
    orders = [
        (f"c{i % args.keys}".encode(), orjson.dumps({"customer": f"c{i % args.keys}", "amount": 1 + i % 7, "id": i}))
        for i in range(args.messages)
    ]
    print(f"python {sys.version.split()[0]} on {platform.machine()}, {args.messages:,} orders over {args.keys:,} keys")
    print(f"best of {args.rounds} rounds; with polling: + {args.poll_us} µs per message\n")
    print(f"{'loop':<28}{'µs/msg':>8}{'msg/s':>12}{'with polling':>15}")
    for name, loop in (
        ("decode", decode),
        ("decode + get/set step", decode_and_step),
        ("decode + aggregate", decode_and_aggregate),
    ):
        micros = best_seconds(loop, orders, args.rounds) / args.messages * 1e6
        print(f"{name:<28}{micros:>8.2f}{1e6 / micros:>12,.0f}{1e6 / (micros + args.poll_us):>15,.0f}")


if __name__ == "__main__":
    main()
