"""Commands that keep no journal stop at their next step once their lease lapses (``Lease.check``).

A rollback, an undo or a restore goes through the executor, which checks its leases before every step.
``prune``, ``backup prune`` and ``ledger sync`` apply on their own; they check their leases before each
write too, so a command whose store slowed down so much that another process may have taken its lease
over never goes on changing things beside that process. Each case slows the S3 server's PUTs (the
lease renewal among them) behind the fault proxy until the lease lapses (time to live 3 s) mid-command:
the command stops with ``LeaseLost`` saying to run it again, having left what it had not reached yet
alone, and running it again (the store healthy) finishes it.
"""

from __future__ import annotations

import json

import boto3
import pytest

from tests.faulty_s3 import FaultPlan
from tests.helpers import cli_json
from tests.test_backup_spark import backup
from tests.test_rollback_s3 import objects, upload
from tests.test_rollback_spark import INTERVALS, target_before_last_compaction

HDFS = pytest.mark.parametrize("flavour", ["hdfs"])
TTL_S = "3"


def _slow(faulty_s3, *kinds: str, delay_s: float = 2.5) -> str:
    """Every request of ``kinds`` answered ``delay_s`` late from now on; the storage options that go through it."""
    faulty_s3.set_plan(FaultPlan(rate=1.0, faults=("slow",), requests=frozenset(kinds), delay_s=delay_s))
    return json.dumps({"endpoint_url": faulty_s3.endpoint})


def _keys(s3_server: str, bucket: str, prefix: str) -> set[str]:
    s3, out, token = boto3.client("s3", endpoint_url=s3_server), set(), None
    while True:
        resp = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, **({"ContinuationToken": token} if token else {}))
        out |= {o["Key"] for o in resp.get("Contents", [])}
        if not resp.get("IsTruncated"):
            return out
        token = resp["NextContinuationToken"]


def _lost(code: int, r: dict) -> None:
    assert code == 1 and r["error"] == "LeaseLost", r
    assert "run the same command again" in r["fix"], r


@HDFS
def test_a_prune_whose_lease_lapses_stops_before_the_next_undo_record(run, bucket, s3_server, faulty_s3, monkeypatch):
    """Every PUT and DeleteObjects 2.5 s late: the prune's lease lapses while it deletes the first
    operation's undo record. It stops before it marks the second pruned: that undo record stays whole and
    undoable (before, the prune went on and deleted it, exit 0), and the prune run again finishes."""
    url = upload(run, bucket, s3_server, versioned=False)
    n = target_before_last_compaction(run)
    ops = []
    for target in (n, n - 2):
        code, r = cli_json("rollback", url, "--to-batch", target, *INTERVALS, "--yes")
        assert code == 0, r
        ops.append(r["result"]["op_id"])
    first, second = ops
    second_trash = objects(s3_server, bucket, f".checkpoint-ops/ckpt/trash/{second}/")
    assert second_trash and objects(s3_server, bucket, f".checkpoint-ops/ckpt/trash/{first}/")

    monkeypatch.setenv("CHECKPOINT_OPS_LEASE_TTL", TTL_S)
    options = _slow(faulty_s3, "PUT", "DELETE-MULTI")
    try:
        code, r = cli_json("prune", url, "--keep-last", "0", "--yes", "--storage-options", options)
    finally:
        faulty_s3.calm()
    _lost(code, r)
    assert objects(s3_server, bucket, f".checkpoint-ops/ckpt/trash/{first}/") == {}
    assert objects(s3_server, bucket, f".checkpoint-ops/ckpt/trash/{second}/") == second_trash
    code, h = cli_json("history", url)
    assert [(e["op_id"], e["undo_record"]) for e in h["operations"]] == [(first, "pruned"), (second, "kept")], h

    code, u = cli_json("undo", url, "--yes")  # the second rollback's undo record is whole
    assert code == 0, u
    code, again = cli_json("prune", url, "--keep-last", "0", "--yes")
    assert code == 0, again
    assert objects(s3_server, bucket, ".checkpoint-ops/ckpt/trash/") == {}


@HDFS
def test_a_ledger_sync_whose_lease_lapses_while_it_reads_records_nothing(run, bucket, s3_server, faulty_s3,
                                                                        monkeypatch):
    """Every GET and every PUT 1.5 s late: the sync reads the new log files while its lease lapses
    (a rollback may have taken it over and truncated the ledger meanwhile). It stops before it writes a
    segment (before, it recorded them, exit 0); run again, it records every batch."""
    url = upload(run, bucket, s3_server, versioned=False)
    monkeypatch.setenv("CHECKPOINT_OPS_LEASE_TTL", TTL_S)
    options = _slow(faulty_s3, "GET", "PUT", delay_s=1.5)  # the renewal (a GET, then a PUT) lands 3 s late
    try:
        code, r = cli_json("ledger", "sync", url, "--storage-options", options)
    finally:
        faulty_s3.calm()
    _lost(code, r)
    assert not _keys(s3_server, bucket, ".checkpoint-ops/ckpt/ledger/"), "a segment was written after the lease lapsed"

    code, r = cli_json("ledger", "sync", url)
    assert code == 0 and r["range"]["last"] == run.last_batch, r
    assert _keys(s3_server, bucket, ".checkpoint-ops/ckpt/ledger/")


@HDFS
def test_a_backup_prune_whose_lease_lapses_stops_before_collecting_objects(run, bucket, s3_server, faulty_s3,
                                                                          monkeypatch):
    """Every PUT and DeleteObjects 2.5 s late: the prune's lease lapses while it deletes the old manifest.
    It stops there, with LeaseLost, before the records, claims, leftovers and objects (before, it went on
    until its prune lock's own check refused, just before the objects); run again, it collects the objects
    only the deleted backup named, and what is left verifies."""
    dest = f"s3://{bucket}/backups"
    backup(run, dest)
    code, r = cli_json("rollback", run.checkpoint, "--to-batch", target_before_last_compaction(run), "--sink",
                       run.output, *INTERVALS, "--yes")  # the newest batches' files: named by the first backup only
    assert code == 0, r
    backup(run, dest)
    manifests = _keys(s3_server, bucket, "backups/manifests/")
    assert len(manifests) == 2
    code, dry = cli_json("backup", "prune", dest, "--keep-last", "1", "--dry-run")
    assert code == 0, dry

    monkeypatch.setenv("CHECKPOINT_OPS_LEASE_TTL", TTL_S)
    options = _slow(faulty_s3, "PUT", "DELETE-MULTI")
    try:
        code, r = cli_json("backup", "prune", dest, "--keep-last", "1", "--yes", "--storage-options", options)
    finally:
        faulty_s3.calm()
    _lost(code, r)
    assert len(_keys(s3_server, bucket, "backups/manifests/")) == 1
    garbage = {f"backups/{a['rel']}" for a in dry["plan"]["actions"] if a["rel"].startswith("objects/")}
    assert garbage and garbage <= _keys(s3_server, bucket, "backups/objects/")

    code, r = cli_json("backup", "prune", dest, "--keep-last", "1", "--yes")
    assert code == 0, r
    assert not garbage & _keys(s3_server, bucket, "backups/objects/")
    code, v = cli_json("backup", "verify", dest)
    assert code == 0, v
