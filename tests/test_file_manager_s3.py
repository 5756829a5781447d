"""The atomic file manager against a real S3 server (moto, over HTTP): conditional puts."""

from __future__ import annotations

import boto3
import pytest

from checkpoint_ops.storage import direct_put, open_file_manager
from tests.helpers import race_create_atomic


def _keys(endpoint, bucket):
    resp = boto3.client("s3", endpoint_url=endpoint).list_objects_v2(Bucket=bucket)
    return sorted(o["Key"] for o in resp.get("Contents", []))


def test_exception_inside_with_leaves_nothing(s3_server, bucket):
    fm, root = open_file_manager(f"s3://{bucket}/ckpt")
    assert fm.strategy == "direct-put"
    with pytest.raises(RuntimeError):
        with fm.create_atomic(f"{root}/offsets/1") as out:
            out.write(b"v1\npartial")
            raise RuntimeError("writer died")
    assert _keys(s3_server, bucket) == []
    w = fm.create_atomic(f"{root}/offsets/2")
    w.write(b"v1")
    w.cancel()
    assert _keys(s3_server, bucket) == []


def test_overwrite_false_is_conditional(s3_server, bucket):
    fm, root = open_file_manager(f"s3://{bucket}/ckpt")
    fm.write_bytes(f"{root}/commits/0", b"first")
    fm.counter.reset()
    with pytest.raises(FileExistsError):
        fm.write_bytes(f"{root}/commits/0", b"second")
    # one PUT, refused by the server (If-None-Match: *), no HEAD-then-PUT; at the first attempt, no GET
    # either: only a retry's 412 may be our own earlier attempt (test_retries_s3)
    assert fm.counter.snapshot() == {"PutObject": 1}
    with pytest.raises(FileExistsError):  # the same bytes too, as on local disk: this call created nothing
        fm.write_bytes(f"{root}/commits/0", b"first")
    assert fm.read_bytes(f"{root}/commits/0") == b"first"
    fm.write_bytes(f"{root}/commits/0", b"third", overwrite=True)
    assert fm.read_bytes(f"{root}/commits/0") == b"third"


def test_write_many_direct_is_conditional_puts(s3_server, bucket):
    """On an object store, creating in place is ``write_many``: one conditional PUT per file, whole or
    absent, an existing object never replaced; nothing here is ever part-written."""
    fm, root = open_file_manager(f"s3://{bucket}/dest")
    fm.write_bytes(f"{root}/objects/old", b"there before")
    fm.counter.reset()
    assert fm.write_many_direct([(f"{root}/objects/new", b"new"), (f"{root}/objects/old", b"other")]) == [True, False]
    assert fm.read_bytes(f"{root}/objects/old") == b"there before"
    assert fm.read_bytes(f"{root}/objects/new") == b"new"
    assert fm.counter.snapshot()["PutObject"] == 2
    assert not fm.names_may_be_partial


@pytest.mark.parametrize("round_", range(5))
def test_racing_writers_exactly_one_winner(s3_server, bucket, round_):
    fms = [open_file_manager(f"s3://{bucket}/ckpt")[0] for _ in range(4)]  # separate clients
    target = f"{bucket}/ckpt/offsets/9"
    results = race_create_atomic(fms, target)
    assert results.count("won") == 1, results
    assert fms[0].read_bytes(target) == f"writer {results.index('won')}".encode()
    assert _keys(s3_server, bucket) == ["ckpt/offsets/9"]


def test_a_multipart_upload_that_loses_the_race_leaves_no_parts(s3_server, bucket):
    """Above 64 MiB a write is a multipart upload; the loser of put-if-absent gets FileExistsError at
    completion and aborts its upload (left open, its parts would stay in the bucket, unlisted)."""
    fm0, root = open_file_manager(f"s3://{bucket}/ckpt")
    fm1, _ = open_file_manager(f"s3://{bucket}/ckpt")
    target = f"{root}/objects/ab/big"
    size = direct_put._SINGLE_PUT_MAX + 1
    loser = fm1.create_atomic(target)  # both writers start before either publishes
    with fm0.create_atomic(target) as out:
        out.write(b"0" * size)
    loser.write(b"1" * size)
    with pytest.raises(FileExistsError):
        loser.close()
    assert fm0.counter.snapshot().get("CreateMultipartUpload") == 1
    assert fm1.pending_uploads(root) == []
    assert boto3.client("s3", endpoint_url=s3_server).list_multipart_uploads(Bucket=bucket).get("Uploads") is None
    assert fm0.read_prefix(target, 4) == b"0000" and _keys(s3_server, bucket) == ["ckpt/objects/ab/big"]


def test_pending_uploads_are_listed_and_aborted(s3_server, bucket):
    fm, root = open_file_manager(f"s3://{bucket}/ckpt")
    s3 = boto3.client("s3", endpoint_url=s3_server)
    started = [s3.create_multipart_upload(Bucket=bucket, Key=f"ckpt/objects/{i:02x}/x")["UploadId"] for i in range(3)]
    s3.create_multipart_upload(Bucket=bucket, Key="elsewhere/y")
    found = fm.pending_uploads(root)
    assert sorted(u.upload_id for u in found) == sorted(started)
    assert {u.path for u in found} == {f"{bucket}/ckpt/objects/{i:02x}/x" for i in range(3)}
    fm.abort_uploads(found)
    fm.abort_uploads(found[:1])  # already gone: ignored
    assert fm.pending_uploads(root) == []
    assert [u["Key"] for u in s3.list_multipart_uploads(Bucket=bucket)["Uploads"]] == ["elsewhere/y"]


def test_batched_delete_and_single_list(s3_server, bucket):
    fm, root = open_file_manager(f"s3://{bucket}/ckpt")
    paths = [f"{root}/state/0/{i}/{v}.delta" for i in range(3) for v in range(400)]
    s3 = boto3.client("s3", endpoint_url=s3_server)
    for p in paths:
        s3.put_object(Bucket=bucket, Key=p.split("/", 1)[1], Body=b"x")
    fm.counter.reset()
    assert len(fm.walk(root)) == 1200
    fm.delete_many(paths + [f"{root}/missing"])
    counts = fm.counter.snapshot()
    assert counts == {"ListObjectsV2": 2, "DeleteObjects": 2}, counts
    assert _keys(s3_server, bucket) == []
