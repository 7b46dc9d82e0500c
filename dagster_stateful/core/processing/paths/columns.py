"""A batch of one partition's messages in columns: the values' field decoded into one column and folded per key.

Owns `decode_field` and `fold_by_key`, the native half of the vectorized aggregations
(`vectorized.VectorizedBatchProcessor`): orjson decodes each value, as the per-message path does,
and the field of every value becomes one NumPy column; Arrow's hashing numbers the distinct message
keys, and NumPy folds the column per key into one partial per distinct key (its count, sum, min or
max, and the offset of its last message). Measured (`bench/bench_decode.py`), orjson value by
value decodes a field faster than Arrow's JSON reader on the whole batch, which also needed checks
that the batch frames exactly as orjson reads it. Arrow's own group-by is not used: its engine
imports `pyarrow.dataset`, which imports pandas, and that took a second of every worker's start.
Decoding refuses, with None, any batch whose field it cannot fold exactly as the per-message path
would: a value orjson refuses or that is not an object, a field that is missing or not a number
(a bool, a null, a string), integers an int64 sum could overflow, or numbers a float64 column
would round. The caller then processes that batch message by message, which finds each bad
message and gives it to the error policy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from dagster_stateful.core.processing.dsl.aggregations import Columnar

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
LEAST_INT64 = -(2**63)
"""The int64 whose magnitude int64 cannot hold."""

KeyPartials = tuple[list[bytes], list[Any], list[int]]
"""Distinct message keys, each one's partial (a number; [sum, count] for a mean), and the offset of
each one's last message in the batch."""


def decode_field(values: list[bytes], field: str) -> np.ndarray | None:
    """`field` of each JSON object value, decoded by orjson as the per-message path decodes it, as an
    int64 column (every value an integer) or a float64 one; None when the batch must go message by
    message (see the module's docstring)."""
    try:
        found = [orjson.loads(value)[field] for value in values]
    except (orjson.JSONDecodeError, KeyError, TypeError):  # not JSON, not an object, no such field
        return None
    kinds = set(map(type, found))
    if kinds == {int}:
        try:
            column = np.array(found, np.int64)
        except OverflowError:
            return None
        if int(column.min()) == LEAST_INT64:
            return None
        return column if int(np.abs(column).max()) * len(found) < INT64_SAFE_SUM else None
    if not kinds <= {int, float}:  # a bool, a null, a string, an array or an object
        return None
    column = np.array(found, np.float64)
    return column if float(np.abs(column).max()) < EXACT_FLOAT_LIMIT else None


def fold_by_key(kind: Columnar, keys: list[bytes], offsets: list[int], column: np.ndarray | None) -> KeyPartials:
    """One partial of `kind` per distinct key of the batch (keys in the order of their first
    message), with its last offset; `column` is the decoded field (None for a count). The keys are
    hashed by Arrow's `dictionary_encode`, and each group folded by NumPy's unbuffered `ufunc.at`,
    in message order."""
    groups, distinct = key_codes(keys)
    partials = partials_of(kind, groups, len(distinct), column)
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
    """Run the fold once (Arrow's compute functions and NumPy's ufuncs set up on first use), so that a
    worker pays for it while starting rather than in its first batch."""
    fold_by_key("sum", [b"k"], [0], decode_field([b'{"v": 1}'], "v"))


def valid_utf8_keys(keys: list[bytes]) -> bool:
    """Whether every key decodes as UTF-8 (what a str key serde checks), in one pass: UTF-8 is
    self-synchronizing, so a line break between the keys lets no invalid key borrow from its neighbours."""
    try:
        b"\n".join(keys).decode()
    except UnicodeDecodeError:
        return False
    return True
