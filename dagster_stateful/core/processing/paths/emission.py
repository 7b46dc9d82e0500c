"""Sending the results of an aggregation that emits per commit, as Kafka Streams' record cache does.

Owns `CommitEmitter`. Before each commit, in every partition transaction, each key of the
aggregation's store written since the last commit sends its latest result once, keyed by its
message key, to the output topic (through the stateless steps after the aggregation). A key sent
by a commit that did not go through (deferred or aborted and rewound) is sent again only if it is
written again; under exactly-once the records belong to the commit's transaction. A step that
fails on a result goes to the error policy, with the source partition and the offset of the last
message that changed the key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from confluent_kafka import Message

from dagster_stateful.core.config import AppConfig
from dagster_stateful.core.processing.dsl.dataframe import StreamingDataFrame
from dagster_stateful.core.processing.dsl.steps import DROPPED, CommitEmission, StepFailed
from dagster_stateful.core.processing.paths.bad_input import BadInputHandler
from dagster_stateful.core.state.keys import split_store_key
from dagster_stateful.core.state.transaction import PartitionTransaction

__all__ = ["CommitEmitter", "commit_emitter"]


def commit_emitter(
    config: AppConfig,
    dataframe: StreamingDataFrame,
    produce: Callable[[str, bytes | None, bytes], None],
    bad_input: BadInputHandler,
) -> CommitEmitter | None:
    """The emitter of the app's aggregation emitting per commit, if it has one."""
    emission = dataframe.commit_emission
    if emission is None:
        return None
    output = config.output if config.emits_output else None
    return CommitEmitter(emission, config.task_topic, output, config.output_serde.dumps, produce, bad_input)


class CommitEmitter:
    """Sends an aggregation's changed results before each commit."""

    def __init__(
        self,
        emission: CommitEmission,
        source: str,
        output: str | None,
        dumps: Callable[[object], bytes],
        produce: Callable[[str, bytes | None, bytes], None],
        bad_input: BadInputHandler,
    ) -> None:
        self._emission = emission
        self._source = source
        self._output = output
        self._dumps = dumps
        self._produce = produce
        self._bad_input = bad_input
        self._active = output is not None or bool(emission.after)
        """Whether anything sees the results (an output topic, or steps after the aggregation)."""

    def emit(self, transactions: Iterable[PartitionTransaction]) -> int:
        """Send what changed since the last commit; returns how many results were sent."""
        if not self._active:
            return 0
        sent = 0
        for txn in transactions:
            cache = txn.caches.get(self._emission.store)
            if cache is not None and cache.dirty:
                sent += self._emit_partition(txn, cache.dirty, cache.values)
        return sent

    def _emit_partition(self, txn: PartitionTransaction, dirty: dict[bytes, int], values: dict[bytes, object]) -> int:
        emission, emitted, output, produce, dumps = (
            self._emission,
            txn.emitted,
            self._output,
            self._produce,
            self._dumps,
        )
        state_key = emission.state_key
        sent = 0
        for key, offset in dirty.items():
            if emitted.get(key) == offset:
                continue
            emitted[key] = offset
            aggregate = values[key]
            if aggregate is None:  # deleted (evicted from a bounded store): nothing to send
                continue
            message_key, scoped = split_store_key(key)
            if scoped != state_key:
                continue
            try:
                value = emission.output(aggregate)
            except StepFailed as failure:
                where = Message(topic=self._source, partition=txn.partition, offset=offset, key=message_key)
                self._bad_input.handle(
                    where, f"step {failure.step!r} (on the result sent at the commit)", failure.error
                )
                continue
            if value is not DROPPED and output is not None:
                produce(output, message_key, dumps(value))
                sent += 1
        return sent
