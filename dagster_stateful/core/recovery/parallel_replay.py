"""Full changelog restores of several store partitions on several cores at once.

Owns `replay_partitions`, which restore runs use for partitions with no local state and no
snapshot to load. A full restore reads every changelog record, and reading and writing SST files
is CPU-bound, so one process replays about a core's worth. The partitions are split into groups of
about equal record counts, one per process: this process replays the first group while child
processes replay the others. Each process has its own restore consumer and runs the ordinary
`ChangelogRestore` (so the at-least-once rule of `uncommitted` holds alike), into
`SstFilesTarget`: each chunk becomes sorted SST files in a directory beside the partition's own
(`replay_directory`; the partition's own is emptied before the files are ingested).
Once every group is written the files are ingested, chunk by chunk in order, and each store
records the position its restore reached; a child that fails fails the whole replay, naming its
partitions, before anything is ingested. A child is a fresh Python running this module's `main`;
its job, with the Kafka settings (which may hold secrets), comes as JSON on its stdin, never in
its arguments, and its result goes back as JSON on its stdout, a file (`ReplayChild`), so that a
parent may poll a child it does not wait for. A worker runs its own restores this way too (see
`processing.background_restores`).
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, overload

from confluent_kafka import Consumer

from dagster_stateful.core.kafka.clients import RESTORE_CONSUMER_CONFIG, KafkaClients
from dagster_stateful.core.monitoring.listeners import Listeners
from dagster_stateful.core.monitoring.report import RestoreKind, RestoreReport
from dagster_stateful.core.recovery.changelog_replay import FULL_RESTORE_CHUNK_RECORDS, ChangelogRestore
from dagster_stateful.core.recovery.child_processes import balanced_groups, child_command, last_words
from dagster_stateful.core.state.changelog_prefix import ChangelogPrefix
from dagster_stateful.core.state.partition import StorePartition
from dagster_stateful.core.state.rocksdb import PartitionDatabase, SortedSstWriter, SstFile
from dagster_stateful.errors import RecoveryError

log = logging.getLogger(__name__)


def replay_directory(store: StorePartition) -> Path:
    """Where a parallel replay of the store partition writes its SST files: beside the partition's
    directory (on the same file system, so ingesting moves them), under a name no partition has."""
    return store.path.parent / f".replay-{store.partition}"


@dataclass(frozen=True)
class ReplayJob:
    """Replay `topic[partition]` from `start` to `end` (a full restore) into SST files in `directory`."""

    store: str
    topic: str
    partition: int
    committed: int | None
    start: int
    end: int
    directory: str
    committed_end: int | None = None
    """The changelog end the group's last commit recorded (`commit_metadata`): no header read below it."""
    bare_uncommitted: bool = False
    """That commit counts records without headers past it as uncommitted."""


@dataclass
class ReplayedPartition:
    partition: int
    chunks: list[list[SstFile]]
    """Each chunk's SST files, in key order; later chunks take precedence over earlier ones."""
    position: int
    """The changelog position the restore reached (never past the first uncommitted record)."""
    report: RestoreReport
    keys_to_rewrite: list[bytes] = field(default_factory=list)
    """Keys the restore skipped in a crashed commit's block (`StorePartition.keys_to_rewrite`)."""


class SstFilesTarget:
    """A full restore's target in a replaying process: each chunk of restored keys becomes sorted SST
    files in `directory` (tombstones included: they shadow the earlier chunks once ingested)."""

    def __init__(self, store: str, partition: int, changelog_topic: str, directory: Path) -> None:
        self.store, self.partition, self.changelog_topic = store, partition, changelog_topic
        self.changelog_offset: int | None = None
        self.source_offset: int | None = None
        self.changelog_prefix: ChangelogPrefix | None = None
        self.keys_to_rewrite: set[bytes] = set()
        self.directory = directory
        self.chunks: list[list[SstFile]] = []
        self.position: int | None = None
        self._keys: set[bytes] = set()

    def holds(self, key: bytes) -> bool:
        return key in self._keys

    def write_restored(self, changes: Iterable[tuple[bytes, bytes | None]], changelog_offset: int) -> None:
        raise RecoveryError("a replaying process runs full restores only, which write SST files")

    def ingest_restored(self, changes: Iterable[tuple[bytes, bytes | None]], changelog_offset: int) -> None:
        writer = SortedSstWriter(self.directory, f"chunk-{len(self.chunks)}")
        for key, value in changes:
            if value is None:
                writer.delete(key)
                self._keys.discard(key)
            else:
                writer.put(key, value)
                self._keys.add(key)
        self.chunks.append(writer.finish())
        self.position = changelog_offset

    def finish_restore(self, changelog_offset: int, source_offset: int | None) -> None:
        self.position = changelog_offset

    def flush(self) -> None:
        """Nothing to do: each chunk's files are complete once written."""


def replay_partitions(
    kafka: KafkaClients,
    group: str,
    stores: dict[int, StorePartition],
    committed: dict[int, int | None],
    marks: dict[int, tuple[int, int]],
    processes: int,
    batch_size: int,
    chunk_records: int = FULL_RESTORE_CHUNK_RECORDS,
    committed_ends: dict[int, int] | None = None,
    bare_uncommitted: Collection[int] = (),
) -> dict[int, RestoreReport]:
    """Restore each open store partition (no local state, kept in RocksDB) from the whole of its
    changelog, on up to `processes` processes; returns each partition's restore report. `marks`:
    each changelog partition's (low, high) offsets, as a `read_committed` reader sees them.
    `committed_ends`: per partition, the changelog end the group's last commit recorded;
    `bare_uncommitted`: the partitions whose last commit counts records without headers past it as
    uncommitted."""
    started = time.monotonic()
    ends = committed_ends or {}
    jobs = [
        replay_job(store, committed.get(p), marks[p], ends.get(p), p in bare_uncommitted) for p, store in stores.items()
    ]
    settings = portable_settings(kafka.settings)
    groups = balanced_groups(jobs, lambda job: job.end - job.start, processes if settings is not None else 1)
    work = child_work(kafka, settings, group, batch_size, chunk_records)
    children = [ReplayChild(work, group_jobs) for group_jobs in groups[1:]]
    try:
        with _restore_consumer(kafka, group) as consumer:
            replayed = {job.partition: _replay(consumer, group, job, batch_size, chunk_records) for job in groups[0]}
        for child in children:
            replayed.update({job.partition: result for job, result in zip(child.jobs, child.result(), strict=True)})
        reports = {
            partition: ingest_replayed(store, replayed[partition], committed.get(partition), started)
            for partition, store in stores.items()
        }
    finally:
        for child in children:
            child.kill()
        for job in jobs:
            shutil.rmtree(job.directory, ignore_errors=True)
    log.info(
        "Replayed the changelogs of store partitions %s in %d process(es) in %.2f s",
        sorted(stores),
        len(groups),
        time.monotonic() - started,
    )
    return reports


def replayable(store: StorePartition) -> bool:
    """Whether a parallel replay can restore the (open) store partition: no local state, in RocksDB."""
    return store.changelog_offset is None and isinstance(store.db, PartitionDatabase)


def child_work(
    kafka: KafkaClients, settings: dict[str, Any] | None, group: str, batch_size: int, chunk_records: int
) -> dict[str, Any]:
    """What every child of a replay is told besides its jobs."""
    work = {"kafka": settings, "admin_timeout": kafka.admin_timeout_seconds, "group": group}
    return work | {"batch_size": batch_size, "chunk_records": chunk_records}


def replay_job(
    store: StorePartition,
    committed: int | None,
    marks: tuple[int, int],
    committed_end: int | None = None,
    bare_uncommitted: bool = False,
) -> ReplayJob:
    """The job of replaying the store partition's changelog from `marks`' low to high, into a fresh
    replay directory."""
    directory = replay_directory(store)
    shutil.rmtree(directory, ignore_errors=True)
    low, high = marks
    topic, partition = store.changelog_topic, store.partition
    return ReplayJob(
        store.store, topic, partition, committed, low, high, str(directory), committed_end, bare_uncommitted
    )


def portable_settings(settings: dict[str, Any]) -> dict[str, Any] | None:
    """The Kafka settings as JSON can carry them to a child; None when some cannot (a callback)."""
    if all(isinstance(value, str | int | float | bool) for value in settings.values()):
        return settings
    log.info("The Kafka settings hold callbacks a child process cannot receive: replaying in this process")
    return None


@contextmanager
def _restore_consumer(kafka: KafkaClients, group: str) -> Iterator[Consumer]:
    """One restore consumer for a process's replays, one after another (each assigns its partition)."""
    consumer = kafka.consumer({"group.id": group, **RESTORE_CONSUMER_CONFIG})
    try:
        yield consumer
    finally:
        consumer.close()


def _replay(consumer: Consumer, group: str, job: ReplayJob, batch_size: int, chunk_records: int) -> ReplayedPartition:
    target = SstFilesTarget(job.store, job.partition, job.topic, Path(job.directory))
    replay = ChangelogRestore(
        consumer,
        Listeners(),
        target,
        job.committed,
        job.start,
        job.end,
        batch_size,
        chunk_records,
        group,
        job.committed_end,
        bare_uncommitted=job.bare_uncommitted,
    )
    while not replay.done:
        replay.step()
    report = replay.finish()
    assert target.position is not None, "finish() records the position"
    return ReplayedPartition(job.partition, target.chunks, target.position, report, sorted(target.keys_to_rewrite))


def ingest_replayed(
    store: StorePartition, replayed: ReplayedPartition, committed: int | None, started: float
) -> RestoreReport:
    """Replace the store partition's state with the replayed SST files, and record the position reached."""
    store.start_fresh()
    for chunk in replayed.chunks:
        store.db.ingest_files([file.path for file in chunk])
    store.finish_restore(replayed.position, committed)
    store.keys_to_rewrite.update(replayed.keys_to_rewrite)
    replayed.report.seconds = time.monotonic() - started
    return replayed.report


class ReplayChild:
    """A child process replaying a group of jobs. Its output goes to temporary files, never to pipes,
    so that a parent that only polls it (`result(wait=False)`) cannot block it on a full pipe.

    Without `jobs` the child starts and waits for them (`give`): started ahead, while the worker
    joins its group, its interpreter and imports are ready when the assignment comes."""

    def __init__(self, work: dict[str, Any] | None = None, jobs: list[ReplayJob] | None = None) -> None:
        self.jobs: list[ReplayJob] = []
        self._outputs = Path(tempfile.mkdtemp(prefix="dagster-stateful-replay-"))
        try:
            with (self._outputs / "stdout").open("wb") as output, (self._outputs / "stderr").open("wb") as errors:
                self._process = subprocess.Popen(
                    child_command(__name__),
                    stdin=subprocess.PIPE,
                    stdout=output,
                    stderr=errors,
                )
        except OSError:
            shutil.rmtree(self._outputs, ignore_errors=True)
            raise
        if work is not None and jobs:
            self.give(work, jobs)

    def give(self, work: dict[str, Any], jobs: list[ReplayJob]) -> None:
        """Hand the (waiting) child its jobs."""
        self.jobs = jobs
        assert self._process.stdin is not None
        with self._process.stdin as stdin:  # the settings may hold secrets: never in a file or an argument
            stdin.write(json.dumps({**work, "jobs": [asdict(job) for job in jobs]}).encode())

    @overload
    def result(self) -> list[ReplayedPartition]: ...
    @overload
    def result(self, wait: bool) -> list[ReplayedPartition] | None: ...
    def result(self, wait: bool = True) -> list[ReplayedPartition] | None:
        """Each job's replayed partition, in the jobs' order, once the child has ended (None while
        it runs, without `wait`); raises `RecoveryError`, naming the partitions, when it failed."""
        code = self._process.wait() if wait else self._process.poll()
        if code is None:
            return None
        output, errors = (self._outputs / "stdout").read_bytes(), (self._outputs / "stderr").read_bytes()
        shutil.rmtree(self._outputs, ignore_errors=True)
        if code != 0:
            topics = sorted({f"{job.topic}[{job.partition}]" for job in self.jobs})
            raise RecoveryError(
                f"replaying {', '.join(topics)} failed in a child process (exit code {code}): {last_words(errors)}. "
                "Nothing was ingested; restore again (the error says whether the brokers or the disk need a look "
                "first)."
            )
        return [_decoded(result) for result in json.loads(output)]

    def kill(self) -> None:
        """End the child if it still runs (the jobs' directories are their owners' to remove)."""
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        shutil.rmtree(self._outputs, ignore_errors=True)


def _encoded(replayed: ReplayedPartition) -> dict[str, Any]:
    return {
        "chunks": [[[file.path, file.records] for file in chunk] for chunk in replayed.chunks],
        "position": replayed.position,
        "report": {**asdict(replayed.report), "kind": str(replayed.report.kind)},
        "rewrite": [key.hex() for key in replayed.keys_to_rewrite],
    }


def _decoded(result: dict[str, Any]) -> ReplayedPartition:
    report = RestoreReport(**{**result["report"], "kind": RestoreKind(result["report"]["kind"])})
    chunks = [[SstFile(path, records) for path, records in chunk] for chunk in result["chunks"]]
    rewrite = [bytes.fromhex(key) for key in result.get("rewrite", ())]
    return ReplayedPartition(report.partition, chunks, result["position"], report, rewrite)


def main() -> None:
    """A child's work: the job on stdin, the replayed partitions on stdout, a failure on stderr."""
    given = sys.stdin.read()
    if not given:
        return  # started ahead and not needed
    work = json.loads(given)
    kafka = KafkaClients(work["kafka"], work["admin_timeout"])
    try:
        with _restore_consumer(kafka, work["group"]) as consumer:
            replayed = [
                _encoded(_replay(consumer, work["group"], ReplayJob(**job), work["batch_size"], work["chunk_records"]))
                for job in work["jobs"]
            ]
    except Exception as error:  # noqa: BLE001 - reported to the parent, which raises it with its context
        sys.stderr.write(f"{type(error).__name__}: {error}\n")
        sys.exit(1)
    sys.stdout.write(json.dumps(replayed))
