"""Standby replicas: warm copies of other members' store partitions.

`replicas` (keeping them up to date) and `placement` (which member, on which host, keeps which
standby).
"""
