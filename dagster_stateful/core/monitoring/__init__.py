"""Monitoring: what a run reports and what an operator or a sensor observes.

`report` (worker and restore reports, stop reasons), `store_metrics` (per-store operation counts
and latencies, record cache hit ratio and RocksDB figures of a run, as Kafka Streams' state store
metrics) with `latency` (durations in fixed memory), `listeners` (restore and state listeners, as
in Kafka Streams), `lag` (Burrow-style consumer-lag evaluation) and `describe` (each store
partition's offsets, lag, keys and bytes, without running a worker).
"""
