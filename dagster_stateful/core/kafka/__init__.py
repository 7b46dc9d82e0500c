"""Kafka: the clients adapter, the app's topics, and Kafka's errors in the project's terms.

`clients` (producers, consumers and admin reads through one set of connection settings, with
retries of transient errors), `provisioning` (every topic an app needs: printed, created where
missing, validated where present), `errors` (`KafkaOperationError` with Kafka's code kept) and
`records` (where a consumed or delivered record sits, and the headers the engine writes).
"""
