"""Local state: where it lives, how it is stored, and what a step sees of it.

`directory` (the on-disk layout, locks, listing, wiping, corrupt copies; it builds every store
partition), `partition` (one RocksDB per store and Kafka partition, with its offsets), `rocksdb`
(the only module that touches rocksdict; SST files), `transaction` (`State` and the write cache
between commits), `live` and `windows` (the state of keyed and windowed aggregations),
`serialization`, `keys` (message-key scoping), `locks` and `checkpoint` (the `.checkpoint` file
other processes read).
"""
