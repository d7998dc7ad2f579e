"""Pure domain logic: memory arithmetic, parsing and validation with no Django, Celery or paramiko.

Everything here is deterministic, does no I/O, and measures memory in integer bytes.
A test walks this package's imports so the boundary cannot drift.
"""
