"""Reading state from outside the stream (Kafka Streams' interactive queries), running worker or not.

Owns `StoreReader`: the local partitions of one store, each opened as a RocksDB secondary instance
(`rocksdb.SecondaryDatabase`), which never takes the partition's lock, so a running worker keeps
its partitions and a stopped one's, or the warm copies the rebalance sensor keeps, read the same.
A reader sees what was committed when it was opened and after each `refresh()`. It reads:
- one key's state (`get`: the message key is looked up in every local partition, since which one
  holds it depends on the producers' partitioner);
- a partition's entries (`items`: all, or one message key's), decoded with the state serializer,
  the expiring stores' expired entries left out;
- a window store's windows (`windows`: all, one message key's, or those starting in a range).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from dagster_stateful.core.state.decoding import RowDecoder, StateEntry, StoreShape, WindowEntry
from dagster_stateful.core.state.directory import StateDirectory
from dagster_stateful.core.state.keys import STREAM_TIME_KEY, encode_state_key, is_reserved, message_prefix
from dagster_stateful.core.state.rocksdb import SecondaryDatabase
from dagster_stateful.core.state.rocksdb_files import holds_database
from dagster_stateful.core.state.serialization import Serde
from dagster_stateful.errors import ConfigurationError

__all__ = ["StateEntry", "StoreReader", "StoreShape", "WindowEntry"]

_START_BYTES = 8


class StoreReader:
    """Every local partition of one store, read without its lock. Close it (or use it as a context manager)."""

    def __init__(
        self,
        directory: StateDirectory,
        shape: StoreShape,
        key_serde: Serde,
        state_serde: Serde,
        partitions: Iterable[int] | None = None,
    ) -> None:
        """partitions: which local partitions to read (default: every one on disk)."""
        self.store = shape.name
        self._shape = shape
        self._decoder = RowDecoder(shape, key_serde, state_serde)
        local = [
            partition
            for partition in directory.local_partitions(shape.name)
            if holds_database(directory.partition_path(shape.name, partition))
        ]
        chosen = local if partitions is None else sorted(set(partitions))
        missing = sorted(set(chosen) - set(local))
        if missing:
            raise ConfigurationError(
                f"store {shape.name!r} has no local state for partitions {missing} under "
                f"{directory.store_dir(shape.name)} (local partitions: {local}); run a worker or a restore of them on "
                "this machine first"
            )
        self._stream_times: dict[int, int] = {}
        self._scratch = Path(tempfile.mkdtemp(prefix=f"state-reader-{shape.name}-"))
        self._databases: dict[int, SecondaryDatabase] = {}
        try:
            for partition in chosen:
                self._databases[partition] = SecondaryDatabase(
                    directory.partition_path(shape.name, partition),
                    self._scratch / str(partition),
                    shape.name,
                    partition,
                )
        except BaseException:
            self.close()
            raise

    @property
    def partitions(self) -> list[int]:
        return sorted(self._databases)

    @property
    def is_window_store(self) -> bool:
        """Whether the store holds windows or sessions (read them with `windows`)."""
        return self._shape.is_window_store

    def refresh(self) -> None:
        """See what the owner has committed since the reader was opened or last refreshed."""
        for database in self._databases.values():
            database.catch_up()
        self._stream_times.clear()

    def stream_time(self, partition: int) -> int:
        """A window or expiring store's stream time in `partition` (-1: none yet)."""
        known = self._stream_times.get(partition)
        if known is None:
            known = self._decoder.stream_time(self._database(partition).get(STREAM_TIME_KEY))
            self._stream_times[partition] = known
        return known

    def get(self, message_key: Any, state_key: str | bytes, default: Any = None) -> Any:
        """The value of `state_key` for `message_key` (as the app's key serializer takes it, or bytes),
        from whichever local partition holds it; `default` when none does (or it has expired)."""
        self._refuse_windows("get")
        store_key = message_prefix(self._decoder.key_bytes(message_key)) + encode_state_key(state_key)
        for partition, database in self._databases.items():
            data = database.get(store_key)
            if data is not None:
                entry = self._decoder.entry(partition, store_key, data, self.stream_time(partition))
                return default if entry is None else entry.value
        return default

    def items(
        self,
        message_key: Any = None,
        partitions: Iterable[int] | None = None,
        from_key: Any = None,
        to_key: Any = None,
    ) -> Iterator[StateEntry]:
        """The entries of the chosen partitions (default: all), in the store's order within each:
        message keys by length, then byte by byte, each key's state keys in byte order. Only
        `message_key`'s when given; else those of message keys from `from_key` to `to_key`
        (inclusive; either optional), as Kafka Streams' `range(from, to)`."""
        self._refuse_windows("items")
        first: bytes | None
        last: bytes | None
        if message_key is not None:
            first = last = message_prefix(self._decoder.key_bytes(message_key))
        else:
            first = None if from_key is None else message_prefix(self._decoder.key_bytes(from_key))
            last = None if to_key is None else message_prefix(self._decoder.key_bytes(to_key))
        for partition in self._chosen(partitions):
            for store_key, data in self._database(partition).items(first):
                if last is not None and store_key[: len(last)] > last:
                    break
                if not is_reserved(store_key):
                    entry = self._decoder.entry(partition, store_key, data, self.stream_time(partition))
                    if entry is not None:
                        yield entry

    def windows(
        self,
        message_key: Any = None,
        start_from: int | None = None,
        start_to: int | None = None,
        partitions: Iterable[int] | None = None,
    ) -> Iterator[WindowEntry]:
        """The windows of a window store, oldest first within each partition: those starting in
        [start_from, start_to] (ms; either bound optional), only `message_key`'s when given. A window
        whose retention the partition's stream time has reached is left out (the next commit deletes it)."""
        if not self._shape.is_window_store:
            raise ConfigurationError(f"store {self.store!r} is not a window store; read it with get() or items()")
        wanted = None if message_key is None else self._decoder.key_bytes(message_key)
        first = None if start_from is None else max(start_from, 0).to_bytes(_START_BYTES, "big")
        for partition in self._chosen(partitions):
            stream_time = self.stream_time(partition)
            for store_key, data in self._database(partition).items(first):
                if is_reserved(store_key):
                    continue
                start = int.from_bytes(store_key[:_START_BYTES], "big")
                if start_to is not None and start > start_to:
                    break
                if wanted is None or store_key[_START_BYTES + 4 :] == wanted:
                    entry = self._decoder.live_window(partition, store_key, data, stream_time)
                    if entry is not None:
                        yield entry

    def _chosen(self, partitions: Iterable[int] | None) -> list[int]:
        return self.partitions if partitions is None else sorted(set(partitions))

    def _database(self, partition: int) -> SecondaryDatabase:
        database = self._databases.get(partition)
        if database is None:
            raise ConfigurationError(
                f"store {self.store!r} partition {partition} is not open in this reader (it reads {self.partitions})"
            )
        return database

    def _refuse_windows(self, what: str) -> None:
        if self._shape.is_window_store:
            raise ConfigurationError(f"store {self.store!r} is a window store: read it with windows(), not {what}()")

    def close(self) -> None:
        for database in self._databases.values():
            database.close()
        self._databases.clear()
        shutil.rmtree(self._scratch, ignore_errors=True)

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
