"""What a full restore's peak memory comes from: its chunk of gathered keys and its fetch size.

A full restore (no local state) gathers the last value of up to `FULL_RESTORE_CHUNK_RECORDS` keys
in memory, then writes them as sorted SST files, while its consumer prefetches up to
`max.partition.fetch.bytes` per fetch. This script produces one changelog partition of --keys
records in the engine's format, then restores it from scratch with the engine's `Restorer`, once
per variant (chunk size and fetch size) and round, each in a fresh process so that its peak RSS
(`VmHWM`) is the restore's own. Printed per variant: the best seconds and records/s over the
rounds, and the highest peak RSS. The first variant is the engine's defaults. Every restored store
is checked by digest against the first one. The machine and settings are printed first.

    .venv/bin/python bench/bench_restore_memory.py                  # 3M records, 3 rounds
    .venv/bin/python bench/bench_restore_memory.py --keys 500000 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench_restore import bench_broker, print_machine, produce_changelog

from dagster_stateful.core.kafka.clients import RESTORE_CONSUMER_CONFIG, KafkaClients
from dagster_stateful.core.recovery.changelog_replay import FULL_RESTORE_CHUNK_RECORDS

TOPIC = f"bench-restore-memory-{uuid.uuid4().hex[:8]}-state-changelog"
MIB = 1 << 20
LIBRDKAFKA_QUEUE_BACKOFF_MS = 1000
"""librdkafka's default `fetch.queue.backoff.ms`."""


@dataclass(frozen=True)
class Variant:
    chunk_records: int
    partition_fetch_bytes: int
    queue_backoff_ms: int

    @property
    def name(self) -> str:
        return (
            f"chunk {self.chunk_records:,} keys, partition fetch {self.partition_fetch_bytes // MIB} MiB, "
            f"queue backoff {self.queue_backoff_ms} ms"
        )


DEFAULTS = Variant(
    FULL_RESTORE_CHUNK_RECORDS,
    int(str(RESTORE_CONSUMER_CONFIG["max.partition.fetch.bytes"])),
    int(str(RESTORE_CONSUMER_CONFIG.get("fetch.queue.backoff.ms", LIBRDKAFKA_QUEUE_BACKOFF_MS))),
)
OTHERS = [
    Variant(250_000, 8 * MIB, LIBRDKAFKA_QUEUE_BACKOFF_MS),
    Variant(250_000, 8 * MIB, 20),
    Variant(250_000, 2 * MIB, 20),
    Variant(250_000, 1 * MIB, 20),
    Variant(100_000, 1 * MIB, 20),
]

RESTORE_IN_A_FRESH_PROCESS = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[5])
from bench_restore import COMMITTED, open_partition
from dagster_stateful.core.kafka.clients import RESTORE_CONSUMER_CONFIG, KafkaClients
from dagster_stateful.core.monitoring.listeners import Listeners
from dagster_stateful.core.recovery.restorer import Restorer
from dagster_stateful.core.recovery.verification import partition_digest
bootstrap, topic, state_dir, variant = sys.argv[1], sys.argv[2], Path(sys.argv[3]), json.loads(sys.argv[4])
kafka = KafkaClients({"bootstrap.servers": bootstrap, "log_level": 0})
settings = {
    **RESTORE_CONSUMER_CONFIG,
    "max.partition.fetch.bytes": variant["partition_fetch_bytes"],
    "fetch.queue.backoff.ms": variant["queue_backoff_ms"],
}
consumer = kafka.consumer({"group.id": "bench-" + state_dir.name, **settings})
store = open_partition(state_dir, topic, 0)
began = time.perf_counter()
Restorer(kafka, consumer, Listeners(), chunk_records=variant["chunk_records"]).restore(store, COMMITTED)
seconds = time.perf_counter() - began
digest = partition_digest(store)
store.close()
consumer.close()
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(json.dumps({"seconds": seconds, "peak_kib": peak, "digest": [digest.sha256, digest.keys]}))
"""


def restore(bootstrap: str, state_dir: Path, variant: Variant) -> dict:
    settings = {
        "chunk_records": variant.chunk_records,
        "partition_fetch_bytes": variant.partition_fetch_bytes,
        "queue_backoff_ms": variant.queue_backoff_ms,
    }
    arguments = [bootstrap, TOPIC, str(state_dir), json.dumps(settings), str(Path(__file__).parent)]
    done = subprocess.run(
        [sys.executable, "-c", RESTORE_IN_A_FRESH_PROCESS, *arguments], check=True, capture_output=True, text=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=3_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--compression", default="none", help="the changelog's compression (the engine's changelogs use none)"
    )
    arguments = parser.parse_args()
    print_machine()
    variants = [DEFAULTS, *(variant for variant in OTHERS if variant != DEFAULTS)]
    print(
        f"settings: {arguments.keys:,} records in one changelog partition ({arguments.compression} compression), "
        f"{arguments.rounds} rounds, restore"
    )
    print(f"consumer {RESTORE_CONSUMER_CONFIG} except the variant's settings; first variant: {DEFAULTS.name}")
    with bench_broker("bench-restore-memory-") as (bootstrap, work):
        KafkaClients({"bootstrap.servers": bootstrap}).create_topic(TOPIC, 1, 1, {"cleanup.policy": "compact"})
        produce_changelog(bootstrap, TOPIC, arguments.keys, 1, compression=arguments.compression)
        results: dict[Variant, list[dict]] = {variant: [] for variant in variants}
        for round_ in range(arguments.rounds):
            for index, variant in enumerate(variants):  # alternating: a slow moment hits every variant
                results[variant].append(restore(bootstrap, work / f"{round_}-{index}", variant))
        expected = results[DEFAULTS][0]["digest"]
        for variant, runs in results.items():
            assert all(run["digest"] == expected for run in runs), f"{variant.name} restored other state"
            assert expected[1] == arguments.keys, f"the store holds {expected[1]:,} keys, not {arguments.keys:,}"
            best = min(run["seconds"] for run in runs)
            peak = max(run["peak_kib"] for run in runs) / 1024
            print(f"{variant.name}: {arguments.keys / best:,.0f} records/s ({best:.2f} s), peak RSS {peak:,.0f} MiB")
    print("check: every restored store has the first one's digest")


if __name__ == "__main__":
    main()
