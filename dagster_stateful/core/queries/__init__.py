"""Queries of an app's state from outside a run, as Kafka Streams' interactive queries.

`describe` (each store partition's offsets, lag, keys and bytes), `key_location` (which member
and host keep a key, active and standbys) and `key_reads` (a key read from the freshest copy).
"""
