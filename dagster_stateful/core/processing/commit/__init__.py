"""The commit path: what makes a crash lose nothing.

`committer` (the commit order), `delivery` (waiting for every acknowledgement), `source_commit`
(the at-least-once offset commit), `transactions` (Kafka transactions, for exactly-once) and
`changelog_positions` (each store partition's changelog end).
"""
