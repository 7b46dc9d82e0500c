"""Monitoring: what a run reports and what an operator or a sensor observes.

`report` (worker and restore reports, stop reasons), `listeners` (restore and state listeners, as
in Kafka Streams) and `lag` (Burrow-style consumer-lag evaluation).
"""
