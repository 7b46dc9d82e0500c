"""The worker's hot path: running the messages of one consumed batch through the steps.

Owns `BatchProcessor`. For each message, in order: decode its key and value, scope the state of
its partition's transaction to its key (and, for windows and expiring stores, its timestamp), run the steps, keep its
writes (or undo them when it fails), send its output (a window step's: one per window result, keyed
by the window's message key) and count it; a message late for all of its windows goes to the error
policy's `handle_late`; a message that the codecs or the steps refuse goes to the
error policy, and damage met in a store goes to the worker's recovery. Per-message work is kept to
what each message needs: a partition's transaction is looked up once per run of its messages,
the steps run as one compiled function, codecs are the C functions they wrap, and the state key
prefix of recent message keys is remembered. An error Kafka hands over instead of a message is
raised (a refused ACL as the `KafkaAuthorizationError` naming it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException, Message

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.kafka.records import position
from dagster_stateful.core.kafka.security.authorization import authorization_error, consuming, is_authorization_failure
from dagster_stateful.core.processing.dsl.dataframe import DROPPED, StepFailed, StreamingDataFrame
from dagster_stateful.core.processing.dsl.joins import NO_TABLE_KEY
from dagster_stateful.core.processing.dsl.windows import Emitted
from dagster_stateful.core.processing.paths.bad_input import BadInputHandler
from dagster_stateful.core.processing.paths.timer_firing import TimerFiring
from dagster_stateful.core.processing.restores.state_updater import Restorations
from dagster_stateful.core.state.keys import message_prefix
from dagster_stateful.core.state.serialization import BytesSerde, fast_loads
from dagster_stateful.core.state.table_join_state import ENDED
from dagster_stateful.core.state.transaction import PartitionTransaction
from dagster_stateful.errors import StoreCorruptedError

__all__ = ["BatchProcessor"]

PREFIXES_REMEMBERED = 100_000
"""Message keys whose state key prefix is remembered; past that the memo starts again."""

NO_KEY = "stateful steps need a message key; this message has none"


class RecordTables(Protocol):
    """The partitioned tables the steps join with (`worker.tables.PartitionedTables`)."""

    def refresh(self, messages: list[Message], start: int) -> None:
        """Fetch the tables of the partitions of `messages[start:]` up to the ends they have now."""
        ...

    def before(self, partition: int, key: bytes, timestamp: int) -> None:
        """Apply the table records that come before this record, and point the joins at it."""
        ...


class JoinedRecords(Protocol):
    """An interval join's joined stream (`worker.joined_streams.JoinedStreams`)."""

    def before(self, txn: PartitionTransaction, timestamp: int, offset: int) -> None:
        """Process the joined stream's records up to `timestamp` in `txn`'s partition, before its
        record at `offset`."""
        ...


class BatchProcessor:
    """Processes consumed messages into the worker's partition transactions."""

    def __init__(
        self,
        config: AppConfig,
        dataframe: StreamingDataFrame,
        transactions: Mapping[int, PartitionTransaction],
        restorations: Restorations,
        bad_input: BadInputHandler,
        produce: Callable[[str, bytes | None, bytes | None], None],
        counts: dict[int, int],
        on_damage: Callable[[int, StoreCorruptedError], None],
        tables: RecordTables | None = None,
        firing: TimerFiring | None = None,
        streams: JoinedRecords | None = None,
    ) -> None:
        """transactions: the worker's, by source partition (kept up to date by its rebalance callbacks);
        produce: (topic, key, value), the commit path's; counts: messages processed per partition,
        updated in place; on_damage(partition, error): recover a store found damaged; tables: the
        partitioned tables the steps join with (None: none); firing: what fires the app's stream-time
        timers between two messages (None: it has none); streams: an interval join's joined stream,
        whose records up to each message's timestamp are processed before it (None: none)."""
        self._streams = streams
        self._tables = tables
        self._firing = firing
        self._config = config
        self.transactions = self._transactions = transactions
        self.restorations = self._restorations = restorations
        self._bad_input = bad_input
        self._produce = produce
        self.counts = self._counts = counts
        self.on_damage = self._on_damage = on_damage
        self._stateful = dataframe.is_stateful
        self._run_steps = dataframe.compiled()
        self._output = config.output if config.emits_output else None
        self._output_dumps = config.output_serde.dumps
        key_serde = config.key_serde
        self._key_check = None if type(key_serde) is BytesSerde else fast_loads(key_serde)
        self._value_loads = fast_loads(config.value_serde)
        self._prefixes: dict[bytes, bytes] = {}
        self.messages_in_columns = 0
        """Always 0: this path takes messages one at a time (`vectorized` counts those it folds)."""

    def process(self, messages: list[Message], start: int, budget: int) -> tuple[int, int]:
        """Process `messages[start:]` until `budget` of them were processed (or passed by the error
        policy); returns the index of the next message and how many were. Messages of partitions
        that are not (or no longer) ours are left alone; the error policy's `ProcessingError` and
        Kafka's errors are raised."""
        index, end, done = start, len(messages), 0
        if self._tables is not None:
            self._tables.refresh(messages, start)
        while index < end and done < budget:
            index, ran = self._process_run(messages, index, end, budget - done)
            done += ran
        return index, done

    def _process_run(self, messages: list[Message], index: int, end: int, budget: int) -> tuple[int, int]:
        """The messages from `index` on that belong to one partition (at most `budget` of them):
        returns the index after them and how many were processed."""
        message = messages[index]
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                return index + 1, 0
            if is_authorization_failure(error):
                doing = f"consuming {self._config.source} in consumer group {self._config.consumer_group!r}"
                raise authorization_error(error, doing, consuming(self._config))
            raise KafkaException(error)
        _, partition, offset = position(message)
        txn = self._transactions.get(partition)
        if txn is None:
            restoring = self._restorations.partitions.get(partition)
            if restoring is not None:
                restoring.note_arrival(offset)  # processed once its restore is done
            return index + 1, 0
        done, damaged = self._run_partition(messages, index, end, budget, partition, txn)
        return index + done + damaged, done

    def _run_partition(
        self, messages: list[Message], index: int, end: int, budget: int, partition: int, txn: PartitionTransaction
    ) -> tuple[int, bool]:
        """The hot loop: consecutive messages of `partition` from `index`, at most `budget`. Returns
        how many it processed (each either processed or passed by the error policy), and whether it
        stopped on a message that found its store damaged (that message comes again from the
        restored store's offsets). Counts them in the worker's report, even when the error policy raises."""
        key_check, value_loads, run_steps = self._key_check, self._value_loads, self._run_steps
        stateful, output, prefixes, tables = self._stateful, self._output, self._prefixes, self._tables
        states, begin, journals, windows = txn.views, txn.begin_scoped, txn.journals, txn.window_list
        observing, firing, streams = txn.observing, self._firing if txn.timers is not None else None, self._streams
        timed = bool(windows or observing)
        done = 0
        try:
            while done < budget and index + done < end:
                if firing is not None:
                    firing.fire_stream(txn)
                message = messages[index + done]
                if message.partition() != partition or message.error() is not None:
                    break
                if streams is not None:
                    streams.before(txn, message.timestamp()[1], message.offset())  # type: ignore[arg-type]
                offset: int = message.offset()  # type: ignore[assignment]  # set: same partition as the first
                raw_key, raw_value = message.key(), message.value()
                try:
                    if key_check is not None and raw_key is not None:
                        key_check(raw_key)
                    value = value_loads(raw_value) if raw_value is not None else None
                except Exception as error:  # noqa: BLE001 - any codec failure is bad input
                    self._reject(message, txn, "deserializing the key or value", self._decode_error(message, error))
                    done += 1
                    continue
                if stateful:
                    if raw_key is None:
                        self._reject(message, txn, "stateful step", ValueError(NO_KEY))
                        done += 1
                        continue
                    prefix = prefixes.get(raw_key)
                    if prefix is None:
                        prefix = self._remember_prefix(raw_key)
                    begin(prefix, offset)
                    if timed:
                        timestamp = message.timestamp()[1]
                        for window in windows:
                            window.timestamp = timestamp
                        for store in observing:
                            store.observe(timestamp)
                if tables is not None:
                    if raw_key is None:
                        self._reject(message, txn, "join", ValueError(NO_TABLE_KEY))
                        done += 1
                        continue
                    tables.before(partition, raw_key, message.timestamp()[1])
                try:
                    result = run_steps(value, states)
                except StepFailed as failure:
                    self._reject(message, txn, f"step {failure.step!r}", failure.error)
                    done += 1
                    continue
                except StoreCorruptedError as damage:
                    txn.discard_message()
                    self._on_damage(partition, damage)
                    return done, True
                for journal in journals:  # what txn.accept_message(offset) does, without a call
                    if journal:
                        journal.clear()
                txn.next_offset = offset + 1
                if result.__class__ is Emitted:
                    self._emit(message, result, txn)
                elif output is not None and result is not DROPPED:
                    self._produce(output, raw_key, self._output_dumps(result))
                done += 1
            if firing is not None:
                firing.fire_stream(txn)
            return done, False
        finally:
            self._counts[partition] = self._counts.get(partition, 0) + done

    def _emit(self, message: Message, emitted: Emitted, txn: PartitionTransaction) -> None:
        """A window step's results to the output topic, each keyed by its window's message key."""
        if emitted.late:
            stream_time = max((window.stream_time for window in txn.window_list), default=-1)
            self._bad_input.handle_late(message, stream_time)
            return
        self.send_windows(emitted)

    def send_windows(self, emitted: Emitted) -> None:
        """Window results to the output topic (if the app has one), each keyed by its window's message key."""
        output, dumps = self._output, self._output_dumps
        if output is not None:
            for key, value in emitted:
                self._produce(output, key, None if value is ENDED else dumps(value))

    def _remember_prefix(self, message_key: bytes) -> bytes:
        prefixes = self._prefixes
        if len(prefixes) >= PREFIXES_REMEMBERED:
            prefixes.clear()
        prefix = prefixes[message_key] = message_prefix(message_key)
        return prefix

    def _decode_error(self, message: Message, error: Exception) -> Exception:
        """The codec's own error for `message`: the fast decoders raise terser ones."""
        config = self._config
        key, value = message.key(), message.value()
        try:
            if key is not None:
                config.key_serde.loads(key)
            if value is not None:
                config.value_serde.loads(value)
        except Exception as described:  # noqa: BLE001 - reported as the message's failure
            return described
        return error

    def _reject(self, message: Message, txn: PartitionTransaction, stage: str, error: BaseException) -> None:
        """Apply the error policy (raises under "raise"); the message then moves the offset only."""
        txn.discard_message()
        self._bad_input.handle(message, stage, error)
        txn.pass_message(position(message)[2])
