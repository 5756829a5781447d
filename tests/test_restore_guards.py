"""``backup restore`` guards and reports, found by a hostile review. Fast tier: ``benchmarks.check_pass.Stream``
(a checkpoint and its file sink in Spark's formats), no Spark.

* ``result.requests`` and ``result.retries`` count each file manager once: the ``ledger`` root shares the
  checkpoint's, and reporting it under both roots counted every checkpoint request twice.
"""

from __future__ import annotations

import json
import os

import boto3

from benchmarks.check_pass import INTERVAL, Stream
from tests.helpers import cli_json

I = ("--source-compact-interval", str(INTERVAL), "--sink-compact-interval", str(INTERVAL))


def _backup(root: str, dest: str, batches: int) -> str:
    """A synthetic query of ``batches`` batches, its ledger synced, backed up into ``dest``: the backup id."""
    s = Stream(root, retain=100)
    for _ in range(batches):
        s.batch()
    code, r = cli_json("ledger", "sync", s.ckpt, "--sink", s.out, *I)
    assert code == 0, r
    code, r = cli_json("backup", "create", s.ckpt, dest, "--sink", s.out, *I)
    assert code == 0, r
    return r["backup_id"]


def _total(per_store: dict) -> int:
    return sum(n for kinds in per_store.values() for n in kinds.values())


def test_restore_reports_each_file_manager_once(tmp_path, s3_server, bucket, faulty_s3):
    """The targets on the S3 server behind the proxy (no faults): the requests ``result.requests`` reports for
    them never exceed what the proxy saw (the leases' own requests are not in it). Before, the ``ledger`` root
    repeated the ``checkpoint``'s counts (the same file manager), so the report exceeded what was sent."""
    dest = str(tmp_path / "dest")  # the backup on local disk: every request through the proxy is the targets'
    backup_id = _backup(str(tmp_path / "a"), dest, 7)
    options = json.dumps({"endpoint_url": faulty_s3.endpoint})
    faulty_s3.reset_stats()
    code, r = cli_json("backup", "restore", dest, backup_id, f"s3://{bucket}/t/ckpt", "--sink-target",
                       f"s3://{bucket}/t/out", "--yes", "--storage-options", options)
    assert code == 0, r
    seen = sum(faulty_s3.reset_stats().requests.values())
    requests = r["result"]["requests"]
    targets = {rid: kinds for rid, kinds in requests.items() if rid not in ("source", "backup")}
    assert 0 < _total(targets) <= seen, (requests, seen)
    assert "ledger" not in requests and "ledger" not in r["result"]["retries"], requests
    assert boto3.client("s3", endpoint_url=s3_server).list_objects_v2(Bucket=bucket, Prefix="t/.checkpoint-ops/ckpt/"
                                                                      "ledger/")["KeyCount"] > 0  # it has a ledger
