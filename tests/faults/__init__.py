"""Fault injection: real worker processes of the counting app, crashed, starved and corrupted, and
the scenarios that judge them against the source topic."""
