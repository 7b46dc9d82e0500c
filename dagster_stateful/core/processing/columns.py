"""A batch of one partition's messages in columns: the values' field decoded in bulk and folded per key.

Owns `decode_field` and `fold_by_key`, the native half of the vectorized aggregations
(`vectorized.VectorizedBatchProcessor`): Arrow's JSON reader decodes one field of every value of
a batch into one column (no Python object per message), and Arrow's hash aggregation folds that
column per message key into one partial per distinct key (its count, sum, min or max, and the
offset of its last message). Decoding refuses, with None, any batch it cannot decode exactly as
the per-message path would: a value that is not one JSON object on one line, that orjson would
refuse (invalid UTF-8, a byte-order mark, NaN or Infinity), whose field is missing, null or not a
number, or whose numbers a float64 column would round. The caller then processes that batch
message by message, which finds each bad message and gives it to the error policy.
"""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from dagster_stateful.core.processing.aggregations import Columnar

__all__ = [
    "ARROW_AGGREGATIONS",
    "KeyPartials",
    "decode_field",
    "fold_by_key",
    "partials_of",
    "valid_utf8_keys",
    "warm_up",
]

EXACT_FLOAT_LIMIT = 2**53
"""Integers a float64 column holds exactly; a float batch with a larger magnitude is left to Python."""
INT64_SAFE_SUM = 2**62
"""Bound on a batch's sum of magnitudes under which an int64 sum cannot overflow."""
NOT_ORJSON = (b"NaN", b"Infinity", b"\xef\xbb\xbf")
"""What Arrow's JSON reader takes and orjson refuses (a string holding them only costs the fast path)."""

_READ = pajson.ReadOptions(use_threads=False, block_size=1 << 22)
_SCHEMAS: dict[tuple[str, str], pajson.ParseOptions] = {}

KeyPartials = tuple[list[bytes], list[Any], list[int]]
"""Distinct message keys, each one's partial (a number; [sum, count] for a mean), and the offset of
each one's last message in the batch."""


def _parse_options(field: str, type_name: str) -> pajson.ParseOptions:
    options = _SCHEMAS.get((field, type_name))
    if options is None:
        schema = pa.schema([(field, pa.int64() if type_name == "int64" else pa.float64())])
        options = _SCHEMAS[(field, type_name)] = pajson.ParseOptions(
            explicit_schema=schema, unexpected_field_behavior="ignore"
        )
    return options


def _framed(values: list[bytes]) -> bytes | None:
    """The values as newline-delimited JSON, or None when a value could hide another's line: a
    blank value yields no row and a value with a line break several."""
    if not all(map(bytes.strip, values)):
        return None
    joined = b"\n".join(values)
    if joined.count(b"\n") != len(values) - 1:
        return None
    if any(marker in joined for marker in NOT_ORJSON):
        return None
    try:
        joined.decode()
    except UnicodeDecodeError:
        return None
    return joined


def decode_field(values: list[bytes], field: str) -> pa.Array | None:
    """`field` of each JSON object value, as an int64 column (every value an integer) or a float64
    one; None when the batch must go message by message (see the module's docstring)."""
    joined = _framed(values)
    if joined is None:
        return None
    for type_name in ("int64", "float64"):
        try:
            table = pajson.read_json(
                io.BytesIO(joined), read_options=_READ, parse_options=_parse_options(field, type_name)
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
        if table.num_rows != len(values):
            return None
        column = table.column(0).combine_chunks()
        if column.null_count:
            return None
        try:
            largest = pc.max(pc.abs_checked(column)).as_py()
        except pa.ArrowInvalid:  # the least int64, whose magnitude int64 cannot hold
            return None
        if type_name == "int64" and largest * len(values) >= INT64_SAFE_SUM:
            return None
        if type_name == "float64" and largest >= EXACT_FLOAT_LIMIT:
            return None
        return column
    return None


ARROW_AGGREGATIONS: dict[Columnar, list[tuple[str, str]]] = {
    "count": [("offset", "count")],
    "sum": [("value", "sum")],
    "min": [("value", "min")],
    "max": [("value", "max")],
    "mean": [("value", "sum"), ("value", "count")],
}


def fold_by_key(kind: Columnar, keys: list[bytes], offsets: list[int], column: pa.Array | None) -> KeyPartials:
    """One partial of `kind` per distinct key of the batch (keys in the order Arrow groups them),
    with its last offset; `column` is the decoded field (None for a count)."""
    table = {"key": pa.array(keys, pa.binary()), "offset": pa.array(offsets, pa.int64())}
    if column is not None:
        table["value"] = column
    grouped = (
        pa.table(table).group_by("key", use_threads=False).aggregate([("offset", "max"), *ARROW_AGGREGATIONS[kind]])
    )
    return grouped.column("key").to_pylist(), partials_of(kind, grouped), grouped.column("offset_max").to_pylist()


def partials_of(kind: Columnar, grouped: pa.Table) -> list[Any]:
    """Each group's partial of `kind`, from the columns of Arrow's `ARROW_AGGREGATIONS[kind]`."""
    if kind == "count":
        return grouped.column("offset_count").to_pylist()
    if kind == "mean":
        return [
            list(pair)
            for pair in zip(
                grouped.column("value_sum").to_pylist(), grouped.column("value_count").to_pylist(), strict=True
            )
        ]
    return grouped.column(f"value_{kind}").to_pylist()


def warm_up() -> None:
    """Load what Arrow loads on first use (its hash-aggregation engine, about half a second), so that
    a worker pays for it while starting rather than in its first batch."""
    fold_by_key("sum", [b"k"], [0], decode_field([b'{"v": 1}'], "v"))


def valid_utf8_keys(keys: list[bytes]) -> bool:
    """Whether every key decodes as UTF-8 (what a str key serde checks), in one pass: UTF-8 is
    self-synchronizing, so a line break between the keys lets no invalid key borrow from its neighbours."""
    try:
        b"\n".join(keys).decode()
    except UnicodeDecodeError:
        return False
    return True
