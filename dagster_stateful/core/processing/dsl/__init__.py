"""The step DSL: what an app declares about its processing.

`dataframe` (the steps: apply, update, filter, aggregate, windows), `steps` (the step kinds),
`aggregations` (the aggregators) and `windows` (window definitions and their results).
"""
