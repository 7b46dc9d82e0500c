"""The worker's columnar path: a columnar aggregation folded a consumed batch at a time.

Owns `VectorizedBatchProcessor`, which takes the place of `batch.BatchProcessor` when the app's
first step is a columnar aggregation, plain and emitting per commit or windowed and emitting
`final()`, and no other step is stateful (`StreamingDataFrame.vectorized`), and its values are
JSON. Like Flink's mini-batch aggregation, each run of one partition's messages in a consumed
batch is decoded in columns and folded per message key (`columns`), or per message key and window
(`window_columns`), in native code; then each distinct key's (or window's) partial is merged into
its aggregate once (`LiveState.merge_partials`: the keys the record cache misses are read with one
RocksDB multi-get), tagged with the offset of its last message, as the per-message path tags it.
A plain aggregation's results are sent at the commit (`emission.CommitEmitter`); a windowed one
moves stream time as its messages would, one at a time, and sends the windows that closed, through
the steps after it, at the end of the run.

A run the columns cannot take exactly (a message without a key or a value, a key the key serde
refuses, a value that is not a JSON object with a number in the field, a stored aggregate the
merge refuses; for windows also a message without a timestamp, a late message, and a closed
window's result that a step after the windows refuses) is halved, and the halves taken in turn,
down to `SPLIT_DOWN_TO` messages, which go through the per-message path: it gives each bad message
to the error policy (raise, skip or dead-letter, with topic, partition and offset) and processes
every good one once. A run is kept whole or not at all, so a bad message costs the fast path to
a few messages around it, never a good message. A batch holding a Kafka error or a partition end
goes message by message. Runs of partitions that are not (or not yet) the worker's are left alone,
as the per-message path leaves them.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from itertools import groupby
from typing import Any

import orjson
from confluent_kafka import Message

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.processing.dsl.steps import ColumnarAggregation, StepFailed
from dagster_stateful.core.processing.paths.batch import BatchProcessor
from dagster_stateful.core.processing.paths.columns import decode_field, fold_by_key, valid_utf8_keys
from dagster_stateful.core.processing.paths.window_columns import fold_by_window
from dagster_stateful.core.state.keys import scoped_keys
from dagster_stateful.core.state.live import PartialsRefused
from dagster_stateful.core.state.serialization import StrSerde
from dagster_stateful.core.state.transaction import PartitionTransaction
from dagster_stateful.errors import StoreCorruptedError

__all__ = ["VECTORIZED_CONSUME_BATCH", "VectorizedBatchProcessor"]

VECTORIZED_CONSUME_BATCH = 10_000
"""Messages a worker asks `consume` for on the columnar path: larger batches fold more messages per key."""
NATIVE_MERGES: dict[str, Callable[[Any, Any], Any]] = {
    "count": operator.add,
    "sum": operator.add,
    "min": min,
    "max": max,
}
"""The columnar aggregators' `merge` as the C functions that do the same, so that a batch merges in
one map(); on a tie `min` and `max` keep their first argument, the aggregate, as the aggregators do."""
SPLIT_DOWN_TO = 32
"""A run the columns refuse is halved until its halves are this short, then goes message by message."""
STORE_KEYS_REMEMBERED = 100_000
"""Message keys whose store key is remembered. Once the memo is full, a batch with a key it does not
hold has its store keys built afresh. Remembering up to a million (the limit before) held 50-95 MiB
more at the peak with 1M keys and was no faster (bench_core.py --aggregate, alternating pairs)."""

_partition_of = Message.partition
"""`Message.partition` itself: `operator.methodcaller` cost 76 ns per message, the method descriptor 17 ns."""


class VectorizedBatchProcessor:
    """Processes consumed messages into the worker's partition transactions, a run of one partition
    at a time, in columns (falling back to `per_message` for a run the columns cannot take)."""

    def __init__(
        self,
        config: AppConfig,
        aggregation: ColumnarAggregation,
        per_message: BatchProcessor,
    ) -> None:
        """aggregation: as `StreamingDataFrame.vectorized` gives it; per_message: the worker's
        per-message processor, whose transactions, restorations, counts, damage recovery and
        output this one shares."""
        self._aggregation = aggregation
        self._store, self._state_key, self._aggregator = (
            aggregation.store,
            aggregation.state_key,
            aggregation.aggregator,
        )
        self._windows = aggregation.windows
        self._kind = self._aggregator.columnar
        assert self._kind is not None
        self._field = self._aggregator.field
        self._merge = NATIVE_MERGES.get(self._kind, self._aggregator.merge)
        self._per_message = per_message
        self._transactions = per_message.transactions
        self._restorations = per_message.restorations
        self._counts = per_message.counts
        self._on_damage = per_message.on_damage
        self._text_keys = type(config.key_serde) is StrSerde
        self._store_keys: dict[bytes, bytes] = {}
        self.runs_in_columns = 0
        """Runs folded in columns (the rest went message by message)."""
        self.runs_per_message = 0
        self.messages_in_columns = 0

    def process(self, messages: list[Message], start: int, budget: int) -> tuple[int, int]:
        """Process `messages[start:]` until `budget` of them were processed (or passed by the error
        policy); returns the index of the next message and how many were, as `BatchProcessor.process`."""
        end = min(len(messages), start + budget)
        chunk = messages[start:end]
        errors = [message.error() for message in chunk]
        if errors.count(None) != len(errors):  # a Kafka error or a partition end: message by message
            return self._per_message.process(messages, start, budget)
        done = 0
        for partition, run in groupby(chunk, _partition_of):
            assert partition is not None, "a consumed message without an error has a partition"
            done += self._process_run(partition, list(run))
        return end, done

    def _process_run(self, partition: int, run: list[Message]) -> int:
        """One partition's consecutive messages; returns how many were processed."""
        txn = self._transactions.get(partition)
        if txn is None:
            restoring = self._restorations.partitions.get(partition)
            if restoring is not None:
                restoring.note_arrival(run[0].offset())  # type: ignore[arg-type]  # processed once restored
            return 0
        if txn.expiring or (txn.window_list and self._windows is None):
            return self._message_by_message(run)
        try:
            return self._take(partition, txn, run)
        except StoreCorruptedError as damage:
            self._on_damage(partition, damage)
            restoring = self._restorations.partitions.get(partition)
            if restoring is not None:
                restoring.note_arrival(run[0].offset())  # type: ignore[arg-type]
            return 0

    def _take(self, partition: int, txn: PartitionTransaction, run: list[Message]) -> int:
        """`run` folded in columns, or, when the columns cannot take it, its halves in turn (so a bad
        message sends only the few messages around it message by message); returns how many were
        processed."""
        if self._fold(txn, run):
            self.runs_in_columns += 1
            self.messages_in_columns += len(run)
            txn.next_offset = run[-1].offset() + 1  # type: ignore[operator]
            self._counts[partition] = self._counts.get(partition, 0) + len(run)
            return len(run)
        if len(run) <= SPLIT_DOWN_TO:
            return self._message_by_message(run)
        half = len(run) // 2
        done = self._take(partition, txn, run[:half])
        if self._transactions.get(partition) is not txn:
            return done  # its store was found damaged: the rest comes again once it is restored
        return done + self._take(partition, txn, run[half:])

    def _message_by_message(self, run: list[Message]) -> int:
        self.runs_per_message += 1
        index, done = 0, 0
        while index < len(run):
            index, processed = self._per_message.process(run, index, len(run) - index)
            done += processed
        return done

    def _fold(self, txn: PartitionTransaction, run: list[Message]) -> bool:
        """Fold `run` into `txn` in columns; False, having changed nothing, when it cannot be."""
        keys = [message.key() for message in run]
        if None in keys or (self._text_keys and not valid_utf8_keys(keys)):  # type: ignore[arg-type]
            return False
        values = [message.value() for message in run]
        if self._field is None:
            if not _all_json(values):
                return False
            column = None
        else:
            if None in values:
                return False
            column = decode_field(values, self._field)  # type: ignore[arg-type]
            if column is None:
                return False
        offsets: list[int] = [message.offset() for message in run]  # type: ignore[misc]
        if self._windows is not None:
            return self._fold_windows(txn, run, keys, offsets, column)  # type: ignore[arg-type]
        distinct, partials, last_offsets = fold_by_key(self._kind, keys, offsets, column)  # type: ignore[arg-type]
        store_keys = self._store_keys_of(distinct)
        try:
            txn.live[self._store].merge_partials(store_keys, partials, last_offsets, self._merge, len(run))
        except PartialsRefused:
            return False
        return True

    def _fold_windows(
        self, txn: PartitionTransaction, run: list[Message], keys: list[bytes], offsets: list[int], column: Any
    ) -> bool:
        """`_fold` of a windowed aggregation: the run's windows merged, stream time moved, and the
        windows that closed sent; False, having changed nothing, when it cannot be."""
        windows = txn.windows[self._store]
        timestamps = [message.timestamp()[1] for message in run]
        assert self._windows is not None and self._kind is not None
        folded = fold_by_window(self._kind, keys, offsets, timestamps, column, self._windows, windows.stream_time)
        if folded is None:
            return False
        prefixes = self._store_keys_of(folded.keys)
        try:
            closed = windows.merge_batch(
                prefixes,
                folded.starts,
                folded.partials,
                folded.last_offsets,
                self._merge,
                len(run),
                folded.stream_time,
                folded.advanced_by,
            )
        except PartialsRefused:
            return False
        try:
            results = self._aggregation.closed_results(closed)
        except StepFailed:
            txn.discard_message()  # the message that closed the window goes alone, to the error policy
            return False
        txn.accept_message(offsets[-1])
        self._per_message.send_windows(results)
        return True

    def _store_keys_of(self, message_keys: list[bytes]) -> list[bytes]:
        memo, state_key = self._store_keys, self._state_key
        store_keys = list(map(memo.get, message_keys))
        if None not in store_keys:
            return store_keys  # type: ignore[return-value]
        unknown = [key for key, known in zip(message_keys, store_keys, strict=True) if known is None]
        if len(memo) + len(unknown) > STORE_KEYS_REMEMBERED:
            return scoped_keys(message_keys, state_key)  # full: new keys are not remembered
        memo.update(zip(unknown, scoped_keys(unknown, state_key), strict=True))
        return [memo[key] for key in message_keys]


def _all_json(values: list[bytes | None]) -> bool:
    """Whether every value (a missing one aside) is JSON, as the per-message path decodes it."""
    try:
        for value in values:
            if value is not None:
                orjson.loads(value)
    except orjson.JSONDecodeError:
        return False
    return True
