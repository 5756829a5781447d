"""A directory in ``offsets/`` named as a batch (``offsets/32``; on S3 the marker ``offsets/32/``, as S3A leaves
a directory): Spark lists it as that batch's file. A rollback above it reported success and left it; Spark then
reran the batches up to it and failed (``CONCURRENT_STREAM_LOG_UPDATE ... Multiple streaming jobs detected for
32``, seen by a hostile review with Spark). The rollback now refuses (exit 2) naming it, and changes nothing.
Fast tier: ``benchmarks.check_pass.Stream``, no Spark."""

from __future__ import annotations

import os

import boto3
import s3fs

from benchmarks.check_pass import INTERVAL, Stream
from tests.helpers import cli_json, tree_snapshot

I = ("--source-compact-interval", str(INTERVAL), "--sink-compact-interval", str(INTERVAL))


def _stream(root: str, batches: int = 25) -> Stream:
    s = Stream(root, retain=100)
    for _ in range(batches):
        s.batch()
    return s


def test_a_rollback_refuses_a_directory_named_as_a_batch_and_changes_nothing(tmp_path):
    s = _stream(str(tmp_path))
    os.mkdir(os.path.join(s.ckpt, "offsets", "25"))  # above the newest batch (24)
    before = tree_snapshot(s.ckpt, s.out)
    code, r = cli_json("rollback", s.ckpt, "--to-batch", "20", "--sink", s.out, *I, "--yes")
    assert code == 2, r
    assert r["path"].endswith("offsets/25") and "directory where Spark expects a batch file" in r["problem"], r
    assert "move the directory" in r["fix"], r
    assert tree_snapshot(s.ckpt, s.out) == before
    os.rmdir(os.path.join(s.ckpt, "offsets", "25"))  # what the fix says: the rollback then goes through
    code, r = cli_json("rollback", s.ckpt, "--to-batch", "20", "--sink", s.out, *I, "--yes")
    assert code == 0, r


def test_a_directory_named_as_a_batch_in_the_source_or_sink_log_is_refused_too(tmp_path):
    """The source log and the sink log are listed by batch too (a second hostile review): a rollback left
    ``sources/0/40`` and ``_spark_metadata/40`` and reported success."""
    s = _stream(str(tmp_path), batches=35)
    for where in (os.path.join(s.ckpt, "sources", "0", "40"), os.path.join(s.out, "_spark_metadata", "40")):
        os.mkdir(where)
        before = tree_snapshot(s.ckpt, s.out)
        code, r = cli_json("rollback", s.ckpt, "--to-batch", "20", "--sink", s.out, *I, "--yes")
        assert code == 2 and r["path"].endswith(where[-len("0/40"):]), r
        assert "directory where Spark expects a batch file" in r["problem"], r
        assert tree_snapshot(s.ckpt, s.out) == before
        os.rmdir(where)


def test_on_s3_a_marker_named_as_a_batch_is_refused_alike(tmp_path, s3_server, bucket):
    s = _stream(str(tmp_path))
    s3fs.S3FileSystem(endpoint_url=s3_server).put(s.ckpt + "/", f"{bucket}/ckpt", recursive=True)
    s3 = boto3.client("s3", endpoint_url=s3_server)
    s3.put_object(Bucket=bucket, Key="ckpt/commits/25/", Body=b"")
    code, r = cli_json("rollback", f"s3://{bucket}/ckpt", "--to-batch", "20", *I, "--yes")
    assert code == 2 and r["path"].endswith("commits/25"), r
    assert "directory where Spark expects a batch file" in r["problem"], r


def test_fsck_names_a_marker_where_a_batch_file_belongs_as_on_local_disk(tmp_path, s3_server, bucket):
    """On S3 it said 'file vanished while reading (is a query running?)', with a fix (roll back) that does not help;
    on local disk 'is a directory where Spark expects a file'. The same finding now (hostile review)."""
    s = _stream(str(tmp_path))
    s3fs.S3FileSystem(endpoint_url=s3_server).put(s.ckpt + "/", f"{bucket}/ckpt", recursive=True)
    boto3.client("s3", endpoint_url=s3_server).put_object(Bucket=bucket, Key="ckpt/offsets/25/", Body=b"")
    os.mkdir(os.path.join(s.ckpt, "offsets", "25"))
    found = {}
    for where in (s.ckpt, f"s3://{bucket}/ckpt"):
        code, r = cli_json("fsck", where, *I)
        assert code == 1, r
        found[where] = [(f["code"], f["problem"]) for f in r["findings"] if f["path"].endswith("offsets/25")]
    assert found[s.ckpt] == found[f"s3://{bucket}/ckpt"] and found[s.ckpt], found
    assert "is a directory where Spark expects a file" in found[s.ckpt][0][1], found


def test_fsck_names_the_directory_and_judges_no_batch_that_never_ran(tmp_path):
    """``commits/9`` made a directory above the newest batch (4): fsck named it, then went on as if batch 9 had
    committed: commits ahead of the offsets, offsets gaps ("restore it from a backup"), missing state, a sink behind
    ("do not delete data files: those of batch 9 are what the sink log lost"), all about a batch that never ran
    (a hostile review). It names the directory and says the other checks wait until it is moved away; once it is,
    fsck is clean."""
    s = _stream(str(tmp_path), batches=5)
    os.mkdir(os.path.join(s.ckpt, "commits", "9"))
    code, r = cli_json("fsck", s.ckpt, "--sink", s.out, *I)
    assert code == 1, r
    assert [(f["severity"], f["code"]) for f in r["findings"]] == [("error", "unreadable-file"),
                                                                   ("warning", "checks-skipped")], r
    assert all(f["path"].endswith("commits/9") for f in r["findings"]), r
    assert "move the directory" in r["findings"][0]["fix"], r
    os.rmdir(os.path.join(s.ckpt, "commits", "9"))
    code, r = cli_json("fsck", s.ckpt, "--sink", s.out, *I)
    assert (code, r["findings"]) == (0, []), r


def test_a_directory_named_as_a_batch_that_holds_an_empty_directory_is_seen_too(tmp_path):
    """``offsets/14/sub``: the listing knew ``sub`` as an empty directory, but not ``offsets/14`` as a subdirectory
    of ``offsets/``, so fsck said healthy and a rollback went through; Spark then failed at batch 14
    (CONCURRENT_STREAM_LOG_UPDATE; a hostile review, with Spark). Both name it now."""
    s = _stream(str(tmp_path), batches=12)
    os.makedirs(os.path.join(s.ckpt, "offsets", "14", "sub"))
    code, r = cli_json("fsck", s.ckpt, "--sink", s.out, *I)
    assert code == 1 and r["findings"][0]["path"].endswith("offsets/14"), r
    before = tree_snapshot(s.ckpt, s.out)
    code, r = cli_json("rollback", s.ckpt, "--to-batch", "9", "--sink", s.out, *I, "--yes")
    assert code == 2 and r["path"].endswith("offsets/14"), r
    assert tree_snapshot(s.ckpt, s.out) == before
