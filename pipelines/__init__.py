"""Dagster definitions (assets, checks, jobs) and the example streaming query they run."""
