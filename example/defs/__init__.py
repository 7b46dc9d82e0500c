"""The example's definitions, loaded by dg: one folder or module per part (see `example/__init__.py`)."""
