"""inspect / offsets / fsck against copies of real checkpoints on a local S3 server (moto, HTTP)."""

from __future__ import annotations

import json

import boto3
import s3fs

from checkpoint_ops.inspect import inspect_checkpoint
from checkpoint_ops.model import Checkpoint, open_sink
from tests.helpers import cli_json
from tests.spark_runs import COMPACT_INTERVAL

INTERVALS = ("--source-compact-interval", str(COMPACT_INTERVAL), "--sink-compact-interval", str(COMPACT_INTERVAL))


def upload(run, bucket, endpoint):
    fs = s3fs.S3FileSystem(endpoint_url=endpoint)
    fs.put(run.checkpoint + "/", f"{bucket}/ckpt", recursive=True)
    fs.put(run.output + "/", f"{bucket}/out", recursive=True)
    return f"s3://{bucket}/ckpt", f"s3://{bucket}/out"


def _without_paths(report):
    """The report with the checkpoint's own location taken out (reasons name files by full URL)."""
    r = dict(report)
    root = r.pop("path")
    r.pop("sink", None)
    r.pop("sinks", None)
    return json.loads(json.dumps(r).replace(root, "<checkpoint>"))


def test_inspect_and_offsets_on_s3_match_local(run, bucket, s3_server):
    ckpt, out = upload(run, bucket, s3_server)
    code, local = cli_json("inspect", run.checkpoint, *INTERVALS[:2])
    code_s3, remote = cli_json("inspect", ckpt, *INTERVALS[:2])
    assert code == code_s3 == 0
    assert remote["path"] == ckpt
    assert _without_paths(remote) == _without_paths(local)
    assert remote["last_committed_batch"] == run.last_batch
    assert remote["state"]["operators"][0]["versions"]["last"] == run.last_batch + 1
    # s3a:// (Hadoop's spelling) works too, and is echoed back as typed
    code, r = cli_json("inspect", ckpt.replace("s3://", "s3a://"), *INTERVALS[:2])
    assert code == 0 and r["path"].startswith("s3a://")
    code, off = cli_json("offsets", ckpt, "--batch", run.last_batch)
    _, off_local = cli_json("offsets", run.checkpoint, "--batch", run.last_batch)
    assert code == 0 and off == off_local


def test_inspect_on_s3_lists_each_root_once(run, bucket, s3_server):
    from checkpoint_ops.ledger import Ledger

    ckpt_url, out_url = upload(run, bucket, s3_server)
    ckpt = Checkpoint.open(ckpt_url, source_compact_interval=COMPACT_INTERVAL)
    sink = open_sink(out_url, compact_interval=COMPACT_INTERVAL)
    report = inspect_checkpoint(ckpt, [sink], ledger=Ledger.for_checkpoint(ckpt))
    counts = ckpt.fm.counter.snapshot()
    # one page for the checkpoint (a few hundred keys) and one for its (empty) ledger beside it,
    # which the rollback window consults below Spark's own files
    assert counts.get("ListObjectsV2") == 2, counts
    assert "HeadObject" not in counts, counts  # reads are single GETs
    assert sink.fm.counter.snapshot().get("ListObjectsV2") == 1
    assert report["rollback_window"]["earliest"] == report["offsets"]["first"] + 1


def test_fsck_on_s3(run, bucket, s3_server):
    ckpt, out = upload(run, bucket, s3_server)
    code, r = cli_json("fsck", ckpt, *INTERVALS)
    assert (code, r["findings"]) == (0, [])
    # The sink log still names the local files Spark wrote: a copy is not where the log points.
    code, r = cli_json("fsck", ckpt, "--sink", out, *INTERVALS)
    assert code == 1
    assert [f["code"] for f in r["findings"]] == ["sink-path-outside-output"]
    assert "file://" in r["findings"][0]["problem"]


def test_fsck_finds_corruptions_on_s3(run, bucket, s3_server):
    ckpt, _ = upload(run, bucket, s3_server)
    s3 = boto3.client("s3", endpoint_url=s3_server)
    last = run.last_batch
    s3.put_object(Bucket=bucket, Key=f"ckpt/offsets/{last}", Body=b"")
    s3.delete_object(Bucket=bucket, Key=f"ckpt/offsets/{last - 1}")
    s3.put_object(Bucket=bucket, Key=f"ckpt/commits/{last - 2}", Body=b"v99\n{}")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="ckpt/")["Contents"]]
    before = {k: s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}
    code, r = cli_json("fsck", ckpt, *INTERVALS)
    after = {k: s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}
    assert before == after
    assert code == 1
    found = {(f["code"], f["path"].rsplit("/ckpt/", 1)[1]) for f in r["findings"]}
    assert ("empty-log-file", f"offsets/{last}") in found
    assert ("offsets-gap", f"offsets/{last - 1}") in found
    assert ("unknown-version", f"commits/{last - 2}") in found
