"""Spark session settings for one run only: set on entry, put back as they were on exit.

A query's own settings (``StreamingQuery.spark_config``) apply to its run, and the next query in the same
session sees the shared ones again. No PySpark import: ``spark`` is any session with ``conf``.
"""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def session_settings(spark, settings: dict):
    """Set each of ``settings`` (a value of None unsets the key) for the block; afterwards each key is
    restored to the value it had, or unset when it had none (a default is not pinned)."""
    before = {}
    for key, value in settings.items():
        before[key] = spark.conf.get(key, None)  # with a default: no exception for an unset key
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, str(value))
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


__all__ = ["session_settings"]
