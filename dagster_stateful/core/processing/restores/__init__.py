"""Restores while a worker runs.

`state_updater` (partitions restored between polls, as Kafka Streams' state updater) and
`background` (full restores of newly assigned partitions on the machine's other cores).
"""
