"""A batch of one partition's messages in columns: the values' field decoded in bulk and folded per key.

Owns `decode_field` and `fold_by_key`, the native half of the vectorized aggregations
(`vectorized.VectorizedBatchProcessor`): Arrow's JSON reader decodes one field of every value of
a batch into one column (no Python object per message), Arrow's hashing numbers the distinct
message keys, and NumPy folds the column per key into one partial per distinct key (its count,
sum, min or max, and the offset of its last message). Arrow's own group-by is not used: its
engine imports `pyarrow.dataset`, which imports pandas, and that took a second of every worker's
start. Decoding refuses, with None, any batch it cannot decode exactly as
the per-message path would: a value that is not one JSON object on one line, that orjson would
refuse (invalid UTF-8, a byte-order mark, NaN or Infinity), whose field is missing, null or not a
number, or whose numbers a float64 column would round. The caller then processes that batch
message by message, which finds each bad message and gives it to the error policy.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from dagster_stateful.core.processing.aggregations import Columnar

__all__ = [
    "KeyPartials",
    "binary_column",
    "decode_field",
    "fold_by_key",
    "key_codes",
    "last_of",
    "numbers",
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


def fold_by_key(kind: Columnar, keys: list[bytes], offsets: list[int], column: pa.Array | None) -> KeyPartials:
    """One partial of `kind` per distinct key of the batch (keys in the order of their first
    message), with its last offset; `column` is the decoded field (None for a count). The keys are
    hashed by Arrow's `dictionary_encode`, and each group folded by NumPy's unbuffered `ufunc.at`,
    in message order."""
    groups, distinct = key_codes(keys)
    values = None if column is None else numbers(column)
    partials = partials_of(kind, groups, len(distinct), values)
    return distinct, partials, last_of(groups, len(distinct), np.array(offsets, np.int64))


def key_codes(keys: list[bytes]) -> tuple[np.ndarray, list[bytes]]:
    """Each message's key as the index of its distinct key, and the distinct keys (in the order of
    their first message)."""
    encoded = pc.dictionary_encode(binary_column(keys))
    return numbers(encoded.indices), encoded.dictionary.to_pylist()


def last_of(groups: np.ndarray, count: int, offsets: np.ndarray) -> list[int]:
    """The greatest offset in each of `count` groups (its last message's, offsets rising)."""
    last = np.full(count, -1, np.int64)
    np.maximum.at(last, groups, offsets)
    return last.tolist()


def partials_of(kind: Columnar, groups: np.ndarray, count: int, values: np.ndarray | None) -> list[Any]:
    """Each of `count` groups' partial of `kind`: its count, the sum, least or greatest of its
    values, or [sum, count] for a mean; `groups` gives each message's group."""
    if kind == "count":
        return np.bincount(groups, minlength=count).tolist()
    assert values is not None
    if kind == "min" or kind == "max":
        folded = np.empty(count, values.dtype)
        folded[groups] = values  # each group starts from one of its own values
        (np.minimum if kind == "min" else np.maximum).at(folded, groups, values)
        return folded.tolist()
    sums = np.zeros(count, values.dtype)
    np.add.at(sums, groups, values)
    if kind == "sum":
        return sums.tolist()
    counts = np.bincount(groups, minlength=count).tolist()
    return [[total, messages] for total, messages in zip(sums.tolist(), counts, strict=True)]


def numbers(column: pa.Array) -> np.ndarray:
    """A numeric Arrow column without nulls as a NumPy array over the same memory (`to_numpy`
    imports pandas the first time, as `pa.array` does)."""
    dtype = np.dtype(column.type.to_pandas_dtype())
    return np.frombuffer(column.buffers()[1], dtype, len(column), column.offset * dtype.itemsize)


def binary_column(values: list[bytes]) -> pa.Array:
    """`values` as an Arrow binary column, built from its buffers: `pa.array` on a Python list
    imports pandas (about a second) the first time, to look for pandas objects in it."""
    lengths = np.fromiter(map(len, values), np.int32, len(values))
    ends = np.concatenate((np.zeros(1, np.int32), np.cumsum(lengths, dtype=np.int32)))
    return pa.Array.from_buffers(pa.binary(), len(values), [None, pa.py_buffer(ends), pa.py_buffer(b"".join(values))])


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
