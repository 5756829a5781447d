"""Deletes and undeletes on S3 when the store answers badly, against the S3 server behind the fault proxy
(tests/faulty_s3.py), no Spark.

The traps: a multi-object delete answered ``200 OK`` whose per-key ``<Error>``s say some keys failed
(transient codes are retried, those keys only, and counted; denied is an answer); on a versioned bucket,
a delete retried after its reply was lost stacks a second delete marker, which an undelete must remove
too; an undelete says which paths it could not bring back; a reply whose body does not match its
checksum is retried; a listing that failed is never read as an empty directory.
"""

from __future__ import annotations

import json

import botocore.exceptions
import pytest

from benchmarks import synthetic
from checkpoint_ops.errors import StoreUnavailableError
from checkpoint_ops.storage import open_file_manager
from checkpoint_ops.storage.retry import transient_reason
from tests.faulty_s3 import FaultPlan
from tests.helpers import cli_json
from tests.test_retries_s3 import _direct, _fm
from tests.test_retries_s3 import _keys as keys

ONCE_PER_DELETE = dict(rate=1.0, limit=1, requests=frozenset({"DELETE-MULTI"}))


def _keys(s3_server, bucket, prefix="root/") -> list[str]:
    return sorted(keys(s3_server, bucket, prefix))


def _put(s3_server, bucket, names: list[str], versioned: bool = False) -> list[str]:
    direct = _direct(s3_server)
    if versioned:
        direct.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    for name in names:
        direct.put_object(Bucket=bucket, Key=f"root/{name}", Body=name.encode())
    return [f"{bucket}/root/{name}" for name in names]


def _markers(s3_server, bucket, key) -> int:
    return len(_direct(s3_server).list_object_versions(Bucket=bucket, Prefix=key).get("DeleteMarkers", []))


# ---- per-key errors of a 200 DeleteObjects ------------------------------------------------------------


def test_per_key_transient_errors_of_a_batch_delete_are_retried_and_counted(faulty_s3, s3_server, bucket):
    paths = _put(s3_server, bucket, ["a", "b", "c"])
    fm, _ = _fm(faulty_s3, bucket)
    faulty_s3.set_plan(FaultPlan(faults=("key-errors",), **ONCE_PER_DELETE))
    fm.delete_many(paths)
    assert _keys(s3_server, bucket) == []
    assert faulty_s3.stats.faults == {("DELETE-MULTI", "key-errors"): 1}
    assert fm.counter.retries() == {"DeleteObjects": 1}
    assert fm.counter.snapshot() == {"DeleteObjects": 2}


def test_per_key_errors_that_never_clear_are_a_store_failure(faulty_s3, s3_server, bucket):
    paths = _put(s3_server, bucket, ["a", "b"])
    fm, _ = _fm(faulty_s3, bucket, max_attempts=3)
    faulty_s3.set_plan(FaultPlan(rate=1.0, faults=("key-errors",), requests=frozenset({"DELETE-MULTI"})))
    with pytest.raises(StoreUnavailableError) as info:
        fm.delete_many(paths)
    assert "DeleteObjects failed 3 time(s)" in info.value.problem
    assert info.value.retries == {"DeleteObjects": 2} and fm.counter.retries() == {"DeleteObjects": 2}
    assert _keys(s3_server, bucket) == ["root/a", "root/b"]


def test_a_per_key_access_denied_is_an_answer_not_retried(faulty_s3, s3_server, bucket):
    paths = _put(s3_server, bucket, ["a"])
    fm, _ = _fm(faulty_s3, bucket)
    faulty_s3.set_plan(FaultPlan(rate=1.0, faults=("key-denied",), requests=frozenset({"DELETE-MULTI"})))
    with pytest.raises(PermissionError, match="AccessDenied"):
        fm.delete_many(paths)
    assert fm.counter.retries() == {}
    assert _keys(s3_server, bucket) == ["root/a"]


def test_a_rollback_whose_deletes_keep_failing_per_key_stops_with_how_to_finish(faulty_s3, s3_server, bucket):
    direct = _direct(s3_server)
    for rel, data in synthetic.files(batches=12, partitions=2, retain_state=13):
        direct.put_object(Bucket=bucket, Key=f"ckpt/{rel}", Body=data)
    url, options = f"s3://{bucket}/ckpt", json.dumps({"endpoint_url": faulty_s3.endpoint, "retry": {"max_attempts": 3}})
    faulty_s3.set_plan(FaultPlan(rate=1.0, faults=("key-errors",), requests=frozenset({"DELETE-MULTI"})))
    code, r = cli_json("rollback", url, "--to-batch", "8", "--yes", "--storage-options", options)
    assert (code, r["error"]) == (2, "StoreUnavailableError"), r
    assert r["retries"]["DeleteObjects"] == 2, r
    assert "checkpoint-ops resume" in r["fix"], r
    faulty_s3.calm()
    code, r = cli_json("resume", url, "--storage-options", options)
    assert code == 0, r
    assert "ckpt/commits/11" not in _keys(s3_server, bucket, "ckpt/") and "ckpt/commits/8" in _keys(s3_server, bucket,
                                                                                                     "ckpt/")


def test_a_rollback_whose_deletes_are_denied_names_the_operation_and_how_to_finish(faulty_s3, s3_server, bucket):
    """A bucket policy without s3:DeleteObject: the fenced rollback stopped with a bare "storage error" that named
    no operation, did not say the checkpoint was fenced, and whose --json had no path or fix (a hostile review).
    Now it says what to mend, then how to finish; once deletes are allowed, the resume it names finishes it."""
    direct = _direct(s3_server)
    for rel, data in synthetic.files(batches=12, partitions=2, retain_state=13):
        direct.put_object(Bucket=bucket, Key=f"ckpt/{rel}", Body=data)
    url, options = f"s3://{bucket}/ckpt", json.dumps({"endpoint_url": faulty_s3.endpoint})
    faulty_s3.set_plan(FaultPlan(rate=1.0, faults=("key-denied",), requests=frozenset({"DELETE-MULTI"})))
    code, r = cli_json("rollback", url, "--to-batch", "8", "--yes", "--storage-options", options)
    assert (code, r["error"], r["path"]) == (2, "StorageError", url), r
    assert "AccessDenied" in r["problem"] and "credentials, permissions" in r["fix"], r
    assert "stays fenced" in r["fix"] and f"checkpoint-ops resume {url}" in r["fix"], r
    for command in ("resume", "undo"):  # still denied: each says what to mend and how it ends (review of 73d2715)
        code, r = cli_json(command, url, "--yes", "--storage-options", options)
        assert (code, r["error"], r["path"]) == (2, "StorageError", url), r
        assert "AccessDenied" in r["problem"] and "credentials, permissions" in r["fix"], r
        assert f"checkpoint-ops {command} {url}" in r["fix"] or f"checkpoint-ops resume {url}" in r["fix"], r
    faulty_s3.calm()
    code, r = cli_json("resume", url, "--storage-options", options)
    assert code == 0, r
    assert "ckpt/commits/11" not in _keys(s3_server, bucket, "ckpt/") and "ckpt/commits/8" in _keys(s3_server, bucket,
                                                                                                     "ckpt/")
    code, f = cli_json("fsck", url, "--storage-options", options)
    assert code == 0, f


def test_prune_reports_the_requests_and_retries_its_deletes_took(faulty_s3, s3_server, bucket):
    """Every mutating command reports ``requests`` and ``retries`` (docs/cli.md); ``prune`` reported neither, so a
    user could not see how hard the store was to reach (a hostile review)."""
    direct = _direct(s3_server)
    for rel, data in synthetic.files(batches=12, partitions=2, retain_state=13):
        direct.put_object(Bucket=bucket, Key=f"ckpt/{rel}", Body=data)
    url, options = f"s3://{bucket}/ckpt", json.dumps({"endpoint_url": faulty_s3.endpoint})
    code, r = cli_json("rollback", url, "--to-batch", "8", "--yes", "--storage-options", options)
    assert code == 0, r
    faulty_s3.set_plan(FaultPlan(faults=("500",), **ONCE_PER_DELETE))  # each batched delete fails once
    code, r = cli_json("prune", url, "--keep-last", "0", "--yes", "--storage-options", options)
    assert code == 0 and r["result"]["files_deleted"] > 0, r
    assert r["result"]["retries"]["checkpoint"].get("DeleteObjects", 0) >= 1, r["result"]
    assert r["result"]["requests"]["checkpoint"].get("DeleteObjects", 0) >= 2, r["result"]


def test_backup_verify_reports_the_requests_and_retries_its_reads_took(faulty_s3, bucket, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    synthetic.write_local(ckpt, batches=6, partitions=2, retain_state=5)
    dest, options = f"s3://{bucket}/backups", json.dumps({"endpoint_url": faulty_s3.endpoint})
    code, r = cli_json("backup", "create", ckpt, dest, "--storage-options", options)
    assert code == 0, r
    faulty_s3.set_plan(FaultPlan(rate=1.0, limit=1, faults=("503",), requests=frozenset({"GET"})))
    code, r = cli_json("backup", "verify", dest, "--storage-options", options)
    assert code == 0 and r["ok"], r
    assert r["retries"].get("GetObject", 0) >= 1 and r["requests"].get("GetObject", 0) > r["retries"]["GetObject"], r


def test_a_backup_whose_intent_cannot_be_deleted_is_still_reported_published(faulty_s3, bucket, tmp_path):
    """A destination that refuses deletes (a policy without s3:DeleteObject): the backup was published, then the
    refused delete of its intent replaced the result with a storage error (exit 2; a hostile review). The intent
    left behind goes stale and the next prune clears it, as after an outage."""
    ckpt = str(tmp_path / "ckpt")
    synthetic.write_local(ckpt, batches=6, partitions=2, retain_state=5)
    dest, options = f"s3://{bucket}/backups", json.dumps({"endpoint_url": faulty_s3.endpoint})
    faulty_s3.set_plan(FaultPlan(rate=1.0, faults=("key-denied",), requests=frozenset({"DELETE-MULTI"})))
    code, r = cli_json("backup", "create", ckpt, dest, "--storage-options", options)
    faulty_s3.calm()
    assert code == 0 and r["batch"] == 5, r
    code, listed = cli_json("backup", "list", dest, "--storage-options", options)
    assert [b["id"] for b in listed["backups"]] == [r["backup_id"]], listed


# ---- versioned buckets: undelete ------------------------------------------------------------------------


def test_undelete_removes_every_marker_a_retried_delete_stacked(faulty_s3, s3_server, bucket):
    paths = _put(s3_server, bucket, ["a", "b", "c"], versioned=True)
    fm, _ = _fm(faulty_s3, bucket)
    faulty_s3.set_plan(FaultPlan(faults=("lost-reply",), **ONCE_PER_DELETE))
    fm.delete_many(paths)  # deleted, reply lost, deleted again: two markers per key
    faulty_s3.calm()
    assert _keys(s3_server, bucket) == [] and _markers(s3_server, bucket, "root/a") == 2
    assert fm.undelete_many(paths) == []
    assert _keys(s3_server, bucket) == ["root/a", "root/b", "root/c"]
    assert _direct(s3_server).get_object(Bucket=bucket, Key="root/b")["Body"].read() == b"b"
    assert _markers(s3_server, bucket, "root/a") == 0


def test_undelete_names_the_paths_it_could_not_bring_back(faulty_s3, s3_server, bucket):
    paths = _put(s3_server, bucket, ["kept", "purged"], versioned=True)
    direct = _direct(s3_server)
    fm, _ = _fm(faulty_s3, bucket)
    fm.delete_many(paths)
    for v in direct.list_object_versions(Bucket=bucket, Prefix="root/purged").get("Versions", []):
        direct.delete_object(Bucket=bucket, Key="root/purged", VersionId=v["VersionId"])  # only its marker is left
    never = f"{bucket}/root/never"
    assert fm.undelete_many(paths + [never]) == [f"{bucket}/root/never", f"{bucket}/root/purged"]
    assert _keys(s3_server, bucket) == ["root/kept"]
    assert fm.undelete_many(paths[:1]) == []  # already current: nothing to do, nothing missing


def test_undelete_retries_per_key_errors(faulty_s3, s3_server, bucket):
    paths = _put(s3_server, bucket, ["a", "b"], versioned=True)
    fm, _ = _fm(faulty_s3, bucket)
    fm.delete_many(paths)
    faulty_s3.set_plan(FaultPlan(faults=("key-errors",), **ONCE_PER_DELETE))
    assert fm.undelete_many(paths) == []
    assert _keys(s3_server, bucket) == ["root/a", "root/b"]
    assert fm.counter.retries() == {"DeleteObjects": 1}


def test_undo_after_a_rollback_whose_delete_was_retried_restores_every_file(faulty_s3, s3_server, bucket):
    direct = _direct(s3_server)
    direct.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    original = {}
    for rel, data in synthetic.files(batches=12, partitions=2, retain_state=13):
        direct.put_object(Bucket=bucket, Key=f"ckpt/{rel}", Body=data)
        original[f"ckpt/{rel}"] = data
    url, options = f"s3://{bucket}/ckpt", json.dumps({"endpoint_url": faulty_s3.endpoint})
    faulty_s3.set_plan(FaultPlan(faults=("lost-reply",), **ONCE_PER_DELETE))
    code, r = cli_json("rollback", url, "--to-batch", "8", "--yes", "--storage-options", options)
    assert code == 0, r
    faulty_s3.calm()
    assert _markers(s3_server, bucket, "ckpt/commits/11") == 2  # the retried delete stacked a second marker
    code, r = cli_json("undo", url, "--yes", "--storage-options", options)
    assert (code, r["result"]["status"]) == (0, "undone"), r
    after = set(_keys(s3_server, bucket, "ckpt/"))
    assert sorted(k for k in original if k not in after) == []
    assert all(direct.get_object(Bucket=bucket, Key=k)["Body"].read() == data for k, data in original.items())


# ---- damaged replies and listings -----------------------------------------------------------------------


def test_a_reply_that_fails_its_checksum_is_retried(faulty_s3, s3_server, bucket):
    body = bytes(range(256)) * 40
    _direct(s3_server).put_object(Bucket=bucket, Key="root/f", Body=body)  # stored with a CRC32
    fm, root = _fm(faulty_s3, bucket)
    faulty_s3.set_plan(FaultPlan(rate=1.0, limit=1, faults=("corrupt",), requests=frozenset({"GET"})))
    assert fm.read_bytes(f"{root}/f") == body
    assert fm.read_many([f"{root}/f"]) == {f"{root}/f": body}
    assert faulty_s3.stats.faults == {("GET", "corrupt"): 1}  # the same GET twice: damaged once
    assert fm.counter.retries() == {"GetObject": 1}


def test_a_checksum_mismatch_is_transient():
    e = botocore.exceptions.FlexibleChecksumError(error_msg="Expected checksum u847nQ== did not match")
    assert transient_reason(e) == "damaged reply (its body does not match its checksum)"


def test_a_failed_listing_is_retried_never_read_as_empty(faulty_s3, s3_server, bucket):
    _put(s3_server, bucket, ["d/x1", "d/sub/y", "e"])
    fm, root = _fm(faulty_s3, bucket, max_attempts=2)
    faulty_s3.set_plan(FaultPlan(rate=1.0, limit=1, faults=("500",), requests=frozenset({"LIST"})))
    assert fm.list(f"{root}/empty") == []
    listed = fm.list(f"{root}/d")
    assert [(f.path, f.is_dir) for f in listed] == [(f"{root}/d/sub", True), (f"{root}/d/x1", False)]
    assert listed[1].size == 4
    stats = faulty_s3.reset_stats()
    assert fm.counter.total_retries == stats.total_faults == 2  # every broken LIST was retried, none swallowed
    assert fm.counter.snapshot() == {"ListObjectsV2": 4}
    faulty_s3.set_plan(FaultPlan(rate=1.0, faults=("500",), requests=frozenset({"LIST"})))
    with pytest.raises(StoreUnavailableError):
        fm.list(f"{root}/empty")
