"""How fast one numeric field of a batch of JSON values is decoded into a column: orjson value by
value (what the columnar aggregations use, `columns.decode_field`) against Arrow's JSON reader on
the whole batch (what they used before, with the checks that the batch frames as orjson reads it).

Both produce the same int64 column. The batches hold one partition's run of a consumed batch
(1,700 values by default: 10,000 messages over 6 partitions), in three shapes: the orders of
bench_compare (3 fields), a wide flat record (21 fields), and a nested one. Prints nanoseconds per
value, the best of `--repeat` timings of `--number` calls each, and the settings.

    .venv/bin/python bench/bench_decode.py
    .venv/bin/python bench/bench_decode.py --values 10000 --repeat 9
"""

from __future__ import annotations

import argparse
import io
import random
import timeit
from collections.abc import Callable

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.json as pajson

from dagster_stateful.core.processing.paths.columns import decode_field

FIELD = "amount"
_READ = pajson.ReadOptions(use_threads=False, block_size=1 << 22)
_PARSE = pajson.ParseOptions(explicit_schema=pa.schema([(FIELD, pa.int64())]), unexpected_field_behavior="ignore")


def arrow_reader(values: list[bytes]) -> np.ndarray | None:
    """The field through Arrow's JSON reader, with the framing checks it needs to read as orjson does."""
    if not all(map(bytes.strip, values)):
        return None
    joined = b"\n".join(values)
    if joined.count(b"\n") != len(values) - 1 or any(m in joined for m in (b"NaN", b"Infinity", b"\xef\xbb\xbf")):
        return None
    joined.decode()
    table = pajson.read_json(io.BytesIO(joined), read_options=_READ, parse_options=_PARSE)
    return np.asarray(table.column(0).combine_chunks())


def shapes(count: int, rng: random.Random) -> dict[str, list[bytes]]:
    def wide() -> bytes:
        record: dict[str, object] = {f"f{j}": ("x" * 10 if j % 2 else j) for j in range(20)}
        record[FIELD] = rng.randrange(100)
        return orjson.dumps(record)

    def nested(i: int) -> bytes:
        items = [{"sku": j, "quantity": 1} for j in range(5)]
        return orjson.dumps(
            {"customer": {"id": i, "name": "n" * 20, "tags": ["a", "b"]}, FIELD: i % 100, "items": items}
        )

    return {
        "orders, 3 fields": [
            b'{"customer": "c%d", "amount": %d, "ts": 1795509340000}' % (rng.randrange(10_000), rng.randrange(100))
            for _ in range(count)
        ],
        "flat, 21 fields": [wide() for _ in range(count)],
        "nested": [nested(i) for i in range(count)],
    }


def per_value_ns(decode: Callable[[list[bytes]], object], values: list[bytes], number: int, repeat: int) -> float:
    best = min(timeit.repeat(lambda: decode(values), number=number, repeat=repeat))
    return best / number / len(values) * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--values", type=int, default=1_700, help="values per batch")
    parser.add_argument("--number", type=int, default=30, help="calls per timing")
    parser.add_argument("--repeat", type=int, default=5, help="timings; the best is reported")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(f"values per batch {args.values}, best of {args.repeat} timings of {args.number} calls, seed {args.seed}")
    print(f"{'shape':18s} {'bytes/value':>11s} {'Arrow reader':>14s} {'orjson':>10s}")
    for name, values in shapes(args.values, random.Random(args.seed)).items():
        expected = arrow_reader(values)
        got = decode_field(values, FIELD)
        assert expected is not None and got is not None and expected.tolist() == got.tolist(), name
        arrow = per_value_ns(arrow_reader, values, args.number, args.repeat)
        ours = per_value_ns(lambda batch: decode_field(batch, FIELD), values, args.number, args.repeat)
        size = sum(map(len, values)) / len(values)
        print(f"{name:18s} {size:11.0f} {arrow:11.0f} ns {ours:7.0f} ns")


if __name__ == "__main__":
    main()
