"""A worker that dies, or waits, between delivering a commit's records and committing its source
offsets: the one point where an at-least-once commit leaves records of uncommitted messages behind.

The worker runs in a child process with a consumer whose `commit` exits (status 9) or waits for a
release file, every changelog and output record of the commit already delivered. Under
exactly-once, "crash" exits in the producer's `commit_transaction` instead: the transaction,
holding the commit's records and offsets, never commits.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
DYING_SESSION = {"session.timeout.ms": 1_500, "heartbeat.interval.ms": 250}
"""The faulty worker's consumer session, as short as the fault tests' killed workers' (the apps' is
6 s, `FAST_GROUP`): the next worker to join the group waits until the group dropped the dead one."""

FAULTY_WORKER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from confluent_kafka import Consumer, Producer
    from support import core_helpers
    from dagster_stateful.core.kafka.clients import KafkaClients

    class FaultyConsumer(Consumer):
        # The source commit comes after every changelog record was delivered: fail right there.
        def commit(self, *args, **kwargs):
            if {fault!r} == "crash":
                os._exit(9)
            release = Path({release!r})
            Path({paused!r}).touch()
            while not release.exists():
                time.sleep(0.05)
            return super().commit(*args, **kwargs)

    class FaultyProducer(Producer):
        # Exactly-once: the transaction holds every record of the commit; fail before it commits.
        def commit_transaction(self, *args, **kwargs):
            if {fault!r} == "crash":
                os._exit(9)
            return super().commit_transaction(*args, **kwargs)

    make_consumer = KafkaClients.consumer
    make_producer = KafkaClients.producer

    def producer(self, config=None):
        if config and "transactional.id" in config:
            return FaultyProducer(self._client_config(config))
        return make_producer(self, config)

    KafkaClients.producer = producer

    def consumer(self, config):
        if "partition.assignment.strategy" in config:
            return FaultyConsumer({{**self.settings, **config, **{session!r}}})
        return make_consumer(self, config)

    KafkaClients.consumer = consumer
    settings = {settings!r}
    if {changelog_config!r} is not None:
        settings["changelog_config"] = {changelog_config!r}
    app = core_helpers.{factory}({bootstrap!r}, {source!r}, {state_dir!r}, {name!r}, commit_every=10_000, **settings)
    app.run_worker(max_seconds=120)
""")


def faulty_worker(
    fault: str,
    tmp_path: Path,
    factory: str = "totals_app",
    changelog_config: dict[str, str] | None = None,
    settings: dict[str, object] | None = None,
    **values: str,
) -> subprocess.Popen:
    """A worker of the app `core_helpers.<factory>` makes (with `settings`), which crashes ("crash")
    or waits ("pause") right before its source commit, every changelog and output record of the
    commit delivered."""
    script = FAULTY_WORKER.format(
        tests=str(TESTS),
        fault=fault,
        factory=factory,
        release=str(tmp_path / "release"),
        paused=str(tmp_path / "paused"),
        changelog_config=changelog_config,
        settings=settings or {},
        session=DYING_SESSION,
        **values,
    )
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def crash_mid_commit(
    tmp_path: Path,
    factory: str = "totals_app",
    changelog_config: dict[str, str] | None = None,
    settings: dict[str, object] | None = None,
    **values: str,
) -> None:
    """Run a `faulty_worker` that crashes at its first commit, and wait for it to die."""
    worker = faulty_worker("crash", tmp_path, factory, changelog_config, settings, **values)
    status = worker.wait(timeout=120)
    assert status == 9, worker.stderr.read().decode()[-2000:] if worker.stderr else ""
