"""The paths a consumed batch takes through the steps: per message, in columns, and a re-keying app's source side.

`batch` (per message), `vectorized` with `columns` and `window_columns` (folded in columns),
`batch_path` (which one a worker runs: the seam that keeps NumPy and Arrow out of every other
worker), `rekeying` (a re-keying app's source records, sent under their new key to the
repartition topic), `emission` (results sent per commit) and `bad_input` (the error policy for
records that do not decode or fail a step).
"""
