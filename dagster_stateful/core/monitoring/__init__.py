"""Monitoring: what a run reports and what an operator or a sensor observes.

`report` (worker and restore reports, stop reasons), `listeners` (restore and state listeners, as
in Kafka Streams), `lag` (Burrow-style consumer-lag evaluation) and `describe` (each store
partition's offsets, lag, keys and bytes, without running a worker).
"""
