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
from tests.fault_runs import (INTERVALS, SOURCE_INTERVAL, Faults, backup_create, backup_prune, backup_restore,
                              fsck_clean, record, rollback_and_undo, rollback_resumed_through_outages, sink_compact,
                              upload, via)
from tests.helpers import cli_json
from tests.test_rollback_spark import target_before_last_compaction

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


def test_a_restores_resume_stopped_at_the_destination_names_itself(v2_run, faulty_s3, s3_server, bucket, tmp_path):
    """An outage, later and later into a restore, until one stops it part-way (journaled): its message names the
    resume. (Before, the restore's intent at the destination, released on the way out on the store still down, put
    its own "nothing was changed; run the same command again" in place of that: run again, the restore is refused,
    the target holding the interrupted one; seen in `make reliability`.) Then outages stop the resume at the backup
    destination, before it changed anything (where it takes the restore's intent again and lists what is left to
    copy): each names the resume too (before: "the backup destination cannot be read", a damaged-input error, or the
    store's "run the same command again"). Once the store answers, the resume finishes it and fsck passes."""
    dest = f"s3://{bucket}/backups"
    code, made = cli_json("backup", "create", v2_run.checkpoint, dest, "--sink", v2_run.output, *INTERVALS)
    assert code == 0, made
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    resume = f"`checkpoint-ops resume {ckpt}`"
    for gets in (20, 40, 80, 160, 320):  # an outage later and later, until one stops the restore part-way (journaled)
        faulty_s3.outage(OUTAGE_S, after_requests=gets, of_kind="GET")
        code, stop = cli_json("backup", "restore", dest, made["backup_id"], ckpt, "--sink-target", out, "--yes",
                              *via(faulty_s3))
        assert code == 2 and stop["error"] == "StoreUnavailableError", stop
        faulty_s3.wait_outage_over()
        if resume in stop["fix"]:
            break
        assert "run the same command again" in stop["fix"], stop  # stopped before it journaled: nothing changed
    else:
        raise AssertionError(f"no outage stopped the restore part-way: {stop}")
    for after in (0, 1, 3):  # down at once (its destination opened), after the intent, after part of the listing
        faulty_s3.outage(OUTAGE_S, after_requests=after, at_next_request=True)  # however long it takes to get there
        code, again = cli_json("resume", ckpt, *via(faulty_s3), *SOURCE_INTERVAL)
        assert code == 2 and again["error"] == "StoreUnavailableError" and resume in again["fix"], (after, again)
        faulty_s3.wait_outage_over()
    code, done = cli_json("resume", ckpt, *via(faulty_s3), *SOURCE_INTERVAL)
    assert code == 0, done
    fsck_clean(ckpt, "--sink", out, *INTERVALS)


_VOLATILE = {"requests", "retries"}  # what differs between two runs on a store that answers
_LEASE_NOTES = ("took over the lease of ",  # after a run the store stopped, which left its lease to go stale
                "the rollback's dry run (nothing was changed) completed, but its lease could not be released (")


def _stable(doc):
    """A command's JSON without its request and retry counts, or a note about its lease (taken over, or left
    because the store failed its release)."""
    if isinstance(doc, dict):
        return {k: _stable(v) for k, v in doc.items() if k not in _VOLATILE}
    if isinstance(doc, (list, tuple)):
        return [_stable(v) for v in doc if not (isinstance(v, str) and v.startswith(_LEASE_NOTES))]
    return doc


def test_an_outage_anywhere_in_a_read_only_command_stops_it_and_is_never_read_as_damage(v2_run, faulty_s3, s3_server,
                                                                                         bucket, monkeypatch):
    """``inspect``, ``fsck`` and a rollback's ``--dry-run`` of a checkpoint on S3 (its ledger synced), with the store
    down from the k-th request on: each run gives the answer it gives on a store that answers, or stops with
    ``StoreUnavailableError`` (exit 2), and then the same command, run again as its message says, gives that answer.
    Never a finding, a file named damaged, a warning lost or another plan: an outage is neither damage nor absence.
    (``StoreUnavailableError`` was a ``BadInputError``, so every handler for damaged input caught outages too, and
    each had to be found and told to let them go.) ``make test`` tries k a third and two thirds of the way
    through each command's requests; the long form (``make reliability``) every k."""
    monkeypatch.setenv("CHECKPOINT_OPS_RETRY_ATTEMPTS", "3")  # a request gives up in milliseconds
    url = upload(v2_run.checkpoint, s3_server, bucket, "ckpt")
    sink = v2_run.output  # on local disk, as Spark wrote it
    code, synced = cli_json("ledger", "sync", url, "--sink", sink, *INTERVALS, *via(faulty_s3))
    assert code == 0, synced
    commands = {"inspect": ("inspect", url, "--sink", sink), "fsck": ("fsck", url, "--sink", sink),
                "rollback --dry-run": ("rollback", url, "--to-batch", str(target_before_last_compaction(v2_run)),
                                       "--sink", sink, "--dry-run")}
    for name, args in commands.items():
        args = (*args, *INTERVALS, *via(faulty_s3))
        faulty_s3.reset_stats()
        clean = _stable(cli_json(*args))
        total = sum(faulty_s3.reset_stats().requests.values())
        assert clean[0] == 0 and _stable(cli_json(*args)) == clean, (name, clean)  # comparable run to run
        points = range(total) if LONG else (total // 3, 2 * total // 3)
        stopped = []
        for after in points:
            faulty_s3.outage(0.5, after_requests=after, at_next_request=True)
            got = _stable(cli_json(*args))
            faulty_s3.wait_outage_over()
            if got != clean:
                assert got[0] == 2 and got[1]["error"] == "StoreUnavailableError", (name, after, got)
                stopped.append(after)
                assert _stable(cli_json(*args)) == clean, (name, after, "run again")
        assert stopped, f"{name}: no outage stopped it (of {total} requests, tried {list(points)})"
