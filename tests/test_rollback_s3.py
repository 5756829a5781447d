"""Rollback and undo against a checkpoint on the S3 server; Spark then resumes from what we wrote.

Spark cannot write to s3a:// here, so the test copies Spark's checkpoint up, rolls it back there
(with the file sink, whose log names local paths, rolled back in place on disk), and copies the
result down for Spark to resume from.
"""

from __future__ import annotations

import shutil

import boto3
import pytest
import s3fs

from tests.helpers import cli_json
from tests.test_rollback_spark import INTERVALS, content_snapshot, exact, finish_and_read, target_before_last_compaction


def _s3(endpoint):
    return boto3.client("s3", endpoint_url=endpoint)


def upload(run, bucket, endpoint, versioned: bool) -> str:
    if versioned:
        _s3(endpoint).put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    s3fs.S3FileSystem(endpoint_url=endpoint).put(run.checkpoint + "/", f"{bucket}/ckpt", recursive=True)
    return f"s3://{bucket}/ckpt"


def download(run, bucket, endpoint) -> None:
    shutil.rmtree(run.checkpoint)
    s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True).get(f"{bucket}/ckpt/", run.checkpoint + "/",
                                                                           recursive=True)


def objects(endpoint, bucket, prefix="ckpt/") -> dict[str, bytes]:
    s3 = _s3(endpoint)
    out, token = {}, None
    while True:
        kw = {"Bucket": bucket, "Prefix": prefix, **({"ContinuationToken": token} if token else {})}
        resp = s3.list_objects_v2(**kw)
        for o in resp.get("Contents", []):
            out[o["Key"]] = s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
        if not resp.get("IsTruncated"):
            return out
        token = resp["NextContinuationToken"]


@pytest.fixture
def v2_run(spark_runs):
    run = spark_runs("rocksdb_v2")
    run.reset()
    yield run
    run.reset()


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "unversioned"])
def test_rollback_on_s3_then_spark_resumes(spark, v2_run, bucket, s3_server, versioned):
    run = v2_run
    url = upload(run, bucket, s3_server, versioned)
    n = target_before_last_compaction(run)
    code, r = cli_json("rollback", url, "--to-batch", n, "--sink", run.output, *INTERVALS, "--yes")
    assert code == 0, r
    deleted = sum(1 for a in r["plan"]["actions"] if a["root"] == "checkpoint" and a["kind"] == "delete")
    req = r["result"]["requests"]["checkpoint"]
    if versioned:  # the delete marker is the undo record: nothing is copied
        assert "CopyObject" not in req and "HeadObject" not in req, req
    else:  # moved aside by server-side copy, then batched deletes
        assert req.get("CopyObject") == deleted, req
    code, f = cli_json("fsck", url, *INTERVALS)
    assert (code, f["findings"]) == (0, [])
    download(run, bucket, s3_server)
    assert finish_and_read(spark, run) == exact(run)


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "unversioned"])
def test_undo_on_s3_restores_every_object(v2_run, bucket, s3_server, versioned):
    run = v2_run
    url = upload(run, bucket, s3_server, versioned)
    before_s3, before_sink = objects(s3_server, bucket), content_snapshot(run.output)
    n = target_before_last_compaction(run)
    code, r = cli_json("rollback", url, "--to-batch", n, "--sink", run.output, *INTERVALS, "--yes")
    assert code == 0, r
    assert objects(s3_server, bucket) != before_s3
    code, u = cli_json("undo", url, "--yes")
    assert code == 0, u
    assert objects(s3_server, bucket) == before_s3
    assert content_snapshot(run.output) == before_sink


def test_killed_rollback_on_s3_resumes(v2_run, bucket, s3_server):
    import os
    import subprocess
    import sys

    run = v2_run
    url = upload(run, bucket, s3_server, versioned=True)
    n = target_before_last_compaction(run)
    code, dry = cli_json("rollback", url, "--to-batch", n, "--sink", run.output, *INTERVALS, "--dry-run")
    env = dict(os.environ, CHECKPOINT_OPS_KILL_AT="12")  # journal, ledger, fence (no .crc on S3), then deletes
    proc = subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", "rollback", url, "--to-batch", str(n),
                           "--sink", run.output, *INTERVALS, "--yes"], env=env, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert objects(s3_server, bucket)["ckpt/metadata"].startswith(b"CHECKPOINT-OPS-FENCE")
    code, res = cli_json("rollback", url, "--resume", *INTERVALS)
    assert code == 0, res
    assert res["result"]["plan_hash"] == dry["plan"]["plan_hash"]
    code, f = cli_json("fsck", url, *INTERVALS)
    assert (code, f["findings"]) == (0, [])
