"""The cyclic garbage collector's thresholds while bulk work runs.

A command, or the checks of a materialization, builds large structures that live until it ends and
hold no cycles: a listing of every file, the state model, a plan with an action per file, the verdicts
of every log file. At Python's default thresholds (700, 10, 10) the collector walks all of them again
and again: a fifth of a rollback of 44,600 files, and 0.6 to 0.8 s of a materialization's checks at
10,000 retained batches (five full collections), went there. ``fewer_collections`` raises the
thresholds for the duration of such work and restores them afterwards, also after a failure. Cycles
are still collected, less often; the CLI's peak memory at 500,000 ledgered batches is unchanged
(``benchmarks/memory.py``).

Used by the CLI around each command, and by the Dagster layer around its compat check (which also
builds the user's query to read its plan, and may restart it on a scratch copy), its check pass and
its health check; not around the materialization's Spark run.
"""

from __future__ import annotations

import contextlib
import gc

BULK_GC_THRESHOLDS = (100_000, 50, 1_000)


@contextlib.contextmanager
def fewer_collections():
    """``BULK_GC_THRESHOLDS`` for the duration of the ``with`` block (the thresholds are process-wide:
    what they were is restored on the way out)."""
    before = gc.get_threshold()
    gc.set_threshold(*BULK_GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)


__all__ = ["BULK_GC_THRESHOLDS", "fewer_collections"]
