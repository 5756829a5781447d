"""Every mutating operation that touches S3, on checkpoints real Spark wrote, through the fault proxy:
under 25 % and 50 % of requests failing (seeded), and during a total outage. Each either completes in one
run or stops cleanly and is finished by what its message says (tests/fault_runs.py); the result passes
fsck / backup verify, undo restores byte for byte, and Spark resumes from rolled-back and restored
checkpoints with exact output.

``make test`` runs a short seeded set (25 %, and short outages with the tests' quick retry policy).
``make reliability`` sets ``CHECKPOINT_OPS_FAULT_MATRIX=long``: 25 % and 50 % with several seeds and a
30-second outage, with the default retry policy, recorded into docs/reliability.md.
"""

from __future__ import annotations

import os

import pytest

from checkpoint_ops.storage.retry import RetryPolicy
from tests.fault_runs import (Faults, backup_create, backup_prune, backup_restore, record, rollback_and_undo,
                              rollback_resumed_through_outages, sink_compact)

LONG = os.environ.get("CHECKPOINT_OPS_FAULT_MATRIX") == "long"

if LONG:
    FAULTS = [Faults(rate=r, seed=s) for r in (0.25, 0.5) for s in (1, 2, 3)] + [Faults(outage_s=30)]
    OUTAGE_S = 30
else:
    FAULTS = [Faults(rate=0.25, seed=1)]
    OUTAGE_S = 3
IDS = [f.label.replace(" %", "pct").replace(" ", "") for f in FAULTS]


@pytest.fixture
def v2_run(spark_runs, faulty_s3, monkeypatch):
    run = spark_runs("rocksdb_v2")
    run.reset()
    if LONG:  # the default policy, as users get it: undo the quick one faulty_s3 (set up first) sets
        for var in ("CHECKPOINT_OPS_RETRY_BASE_DELAY", "CHECKPOINT_OPS_RETRY_MAX_DELAY"):
            monkeypatch.delenv(var, raising=False)
        assert RetryPolicy.resolve() == RetryPolicy(), "the long form must run with the default retry policy"
    yield run
    run.reset()


@pytest.mark.parametrize("faults", FAULTS, ids=IDS)
def test_rollback_and_undo_on_a_flaky_store(spark, v2_run, faulty_s3, s3_server, bucket, faults):
    rows = rollback_and_undo(spark, v2_run, s3_server, bucket, faulty_s3, faults)
    for row in rows:
        record(row)
    assert rows[-1].spark_checked


@pytest.mark.parametrize("faults", FAULTS, ids=IDS)
def test_backups_and_sink_compaction_on_a_flaky_store(spark, v2_run, faulty_s3, s3_server, bucket, faults, tmp_path):
    created, doc = backup_create(v2_run, s3_server, bucket, faulty_s3, faults)
    restored = backup_restore(spark, v2_run, bucket, faulty_s3, faults, doc["backup_id"], tmp_path)
    compacted = sink_compact(v2_run, s3_server, bucket, faulty_s3, faults, doc["backup_id"])
    pruned = backup_prune(v2_run, s3_server, bucket, faulty_s3, faults)
    for row in (created, restored, compacted, pruned):
        record(row)
    assert restored.spark_checked


def test_a_resume_stopped_by_the_store_is_resumed(spark, v2_run, faulty_s3, s3_server, bucket):
    """An outage stops the rollback part-way, another stops its resume part-way: each message names
    the same resume, which then finishes it, and Spark resumes exactly."""
    record(rollback_resumed_through_outages(spark, v2_run, s3_server, bucket, faulty_s3, OUTAGE_S))
