"""This repository's code location: the example streaming queries (`event_counts.py`), their definitions
(`definitions.py`, built with the package `dagster_checkpoint_ops`) and `make demo` (`demo.py`)."""
