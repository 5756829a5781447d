"""One retry policy for every object-store request (checkpoint_ops/storage/retry.py), and what a retried
request means to the direct-put file manager, against the S3 server behind the fault proxy.

The traps: a conditional PUT whose first attempt was stored comes back 412 (our own write, by content,
not a lost race); a retried delete of keys already gone; a retried copy; a retried listing page (no key
twice, none missing); not-found never retried; a truncated read retried, never parsed.
"""

from __future__ import annotations

import json
import os

import boto3
import botocore.exceptions
import pytest

from checkpoint_ops.errors import StorageError, StoreUnavailableError
from checkpoint_ops.storage import FileChangedError, OpCounter, open_file_manager
from checkpoint_ops.storage import direct_put
from checkpoint_ops.storage.retry import Retrier, RetryPolicy, transient_reason
from tests.faulty_s3 import FAULTS, FaultPlan

FAILING = tuple(f for f in FAULTS if f != "slow")  # the faults that fail a request (a slow reply only delays it)


def _fm(proxy, bucket, **retry):
    opts = {"endpoint_url": proxy.endpoint}
    if retry:
        opts["retry"] = retry
    return open_file_manager(f"s3://{bucket}/root", opts)


def _direct(s3_server):
    return boto3.client("s3", endpoint_url=s3_server)


def _keys(s3_server, bucket, prefix="root/") -> list[str]:
    s3, out, token = _direct(s3_server), [], None
    while True:
        resp = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, **({"ContinuationToken": token} if token else {}))
        out += [o["Key"] for o in resp.get("Contents", [])]
        if not resp.get("IsTruncated"):
            return out
        token = resp["NextContinuationToken"]


# ---- the policy, without a server ------------------------------------------------------------------------


def _client_error(status: int, code: str) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError({"Error": {"Code": code, "Message": "m"},
                                            "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")


def test_which_failures_are_worth_another_attempt():
    assert transient_reason(_client_error(503, "SlowDown")) == "503 SlowDown"
    assert transient_reason(_client_error(500, "InternalError")) == "500 InternalError"
    assert transient_reason(_client_error(503, "503")) == "503"  # a HEAD's error has no body
    translated = OSError(16, "Please reduce your request rate")  # how s3fs hands it on
    translated.__cause__ = _client_error(503, "SlowDown")
    assert transient_reason(translated) == "503 SlowDown"
    assert "truncated" in transient_reason(botocore.exceptions.IncompleteReadError(actual_bytes=1, expected_bytes=2))
    assert transient_reason(botocore.exceptions.ConnectionClosedError(endpoint_url="http://x"))
    assert transient_reason(ConnectionResetError(104, "reset"))
    # answers: retrying would not change them
    for status, code in ((404, "NoSuchKey"), (403, "AccessDenied"), (412, "PreconditionFailed"), (400, "Bad")):
        assert transient_reason(_client_error(status, code)) is None
    for answer in (FileNotFoundError("k"), FileExistsError("k"), PermissionError("k"), ValueError("x")):
        assert transient_reason(answer) is None


def test_backoff_is_exponential_capped_and_jittered():
    policy = RetryPolicy(max_attempts=10, base_delay_s=0.1, max_delay_s=1.0)
    assert [policy.delay_s(n, rand=lambda: 1.0) for n in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert policy.delay_s(3, rand=lambda: 0.5) == 0.2  # full jitter: anywhere in [0, cap]
    assert policy.delay_s(3, rand=lambda: 0.0) == 0.0


def test_attempts_are_bounded_counted_and_answers_are_never_retried():
    counter, waits = OpCounter(), []
    retrier = Retrier(RetryPolicy(max_attempts=4, base_delay_s=0.1, max_delay_s=1.0), counter, sleep=waits.append,
                      rand=lambda: 1.0)
    calls = []

    def flaky():
        calls.append(1)
        raise _client_error(503, "SlowDown")

    with pytest.raises(StoreUnavailableError) as err:
        retrier.call("GetObject", "s3://b/k", flaky)
    assert len(calls) == 4 and waits == [0.1, 0.2, 0.4] and counter.retries() == {"GetObject": 3}
    assert "GetObject failed 4 time(s)" in err.value.problem and "503 SlowDown" in err.value.problem
    assert err.value.path == "s3://b/k" and "run the same command again" in err.value.fix
    assert err.value.to_dict()["retries"] == {"GetObject": 3}
    assert not isinstance(err.value, OSError)  # never mistaken for a damaged file

    calls.clear()

    def missing():
        calls.append(1)
        raise FileNotFoundError("s3://b/k")

    with pytest.raises(FileNotFoundError):
        retrier.call("GetObject", "s3://b/k", missing)
    assert len(calls) == 1 and counter.retries() == {"GetObject": 3}

    outcomes = iter([_client_error(500, "InternalError"), ConnectionResetError(104, "reset")])

    def recovers():
        e = next(outcomes, None)
        if e is not None:
            raise e
        return "done"

    assert retrier.call("PutObject", "s3://b/k", recovers) == "done"
    assert counter.retries() == {"GetObject": 3, "PutObject": 2}


def test_policy_from_environment_and_storage_options(monkeypatch, s3_server, bucket):
    monkeypatch.setenv("CHECKPOINT_OPS_RETRY_ATTEMPTS", "3")
    monkeypatch.setenv("CHECKPOINT_OPS_RETRY_MAX_DELAY", "2.5")
    assert RetryPolicy.resolve() == RetryPolicy(max_attempts=3, base_delay_s=0.1, max_delay_s=2.5)
    assert RetryPolicy.resolve({"max_attempts": 7}) == RetryPolicy(max_attempts=7, max_delay_s=2.5)
    fm, _ = open_file_manager(f"s3://{bucket}/x", {"retry": {"max_attempts": 2, "base_delay_s": 0}})
    assert fm.retrier.policy == RetryPolicy(max_attempts=2, base_delay_s=0.0, max_delay_s=2.5)
    # botocore's and s3fs's own retries are off: ours is the only layer that retries
    assert fm.fs.retries == 1 and fm.fs.s3.meta.config.retries["total_max_attempts"] == 1
    # nan slept as a delay raised inside the first retry, after a rollback had fenced its checkpoint; 2.7 became 2
    for bad in ({"retry": {"attempts": 2}}, {"retry": {"max_attempts": 0}}, {"retry": 3},
                {"retry": {"max_delay_s": "nan"}}, {"retry": {"base_delay_s": float("inf")}},
                {"retry": {"max_attempts": 2.7}}, {"retry": {"max_attempts": "2.7"}}, {"retry": {"max_delay_s": 1e300}}):
        with pytest.raises(StorageError, match="retry"):
            open_file_manager(f"s3://{bucket}/x", bad)
    monkeypatch.setenv("CHECKPOINT_OPS_RETRY_MAX_DELAY", "nan")
    with pytest.raises(StorageError, match="CHECKPOINT_OPS_RETRY_MAX_DELAY"):
        open_file_manager(f"s3://{bucket}/x")
    monkeypatch.setenv("CHECKPOINT_OPS_RETRY_MAX_DELAY", "2.5")
    assert RetryPolicy.resolve({"max_attempts": 2.0}).max_attempts == 2  # a whole number written as a float
    monkeypatch.setenv("CHECKPOINT_OPS_RETRY_ATTEMPTS", "many")
    with pytest.raises(StorageError, match="CHECKPOINT_OPS_RETRY_ATTEMPTS"):
        open_file_manager(f"s3://{bucket}/x")


# ---- the file manager behind the fault proxy ----------------------------------------------------------------


@pytest.mark.parametrize("fault", FAILING)
def test_every_request_kind_survives_each_fault(faulty_s3, s3_server, bucket, fault):
    """Every request fails once with the fault (reset, lost reply, 500, 503 SlowDown, truncated): every
    call still does exactly its job, and each retry is counted, by kind. aiohttp's own resend of a
    request on a dead reused connection is off, so no retry happens out of sight."""
    direct = _direct(s3_server)
    for i in range(5):
        direct.put_object(Bucket=bucket, Key=f"root/dir/{i}", Body=f"file {i}".encode() * 100)
    fm, root = _fm(faulty_s3, bucket)
    faulty_s3.set_plan(FaultPlan(rate=1.0, limit=1, faults=(fault,)))

    assert fm.read_bytes(f"{root}/dir/0") == b"file 0" * 100
    assert fm.read_prefix(f"{root}/dir/1", 6) == b"file 1"
    assert fm.read_many([f"{root}/dir/{i}" for i in range(5)] + [f"{root}/none"]) == \
        {**{f"{root}/dir/{i}": f"file {i}".encode() * 100 for i in range(5)}, f"{root}/none": None}
    with fm.open_read(f"{root}/dir/2") as f:
        assert f.read() == b"file 2" * 100
    assert fm.info(f"{root}/dir/3").size == 600 and fm.info(f"{root}/none") is None
    assert sorted(f.name for f in fm.walk(root)) == ["0", "1", "2", "3", "4"]
    assert sorted(f.name for f in fm.list(f"{root}/dir")) == ["0", "1", "2", "3", "4"]
    fm.write_bytes(f"{root}/new/created", b"conditional", overwrite=False)
    fm.write_bytes(f"{root}/dir/0", b"replaced", overwrite=True)
    fm.copy(f"{root}/dir/1", f"{root}/copied/1")
    assert fm.move_many([(f"{root}/dir/2", f"{root}/moved/2"), (f"{root}/none", f"{root}/moved/none")]) == \
        [f"{root}/none"]
    fm.delete_many([f"{root}/dir/3", f"{root}/dir/4", f"{root}/none"])
    assert fm.versioning_enabled(root) is False

    got = {k: direct.get_object(Bucket=bucket, Key=k)["Body"].read() for k in _keys(s3_server, bucket)}
    assert got == {"root/dir/0": b"replaced", "root/dir/1": b"file 1" * 100, "root/new/created": b"conditional",
                   "root/copied/1": b"file 1" * 100, "root/moved/2": b"file 2" * 100}
    stats = faulty_s3.reset_stats()
    assert stats.faulted_kinds() >= {"GET", "HEAD", "LIST", "PUT", "PUT-IF-NONE-MATCH", "COPY", "DELETE-MULTI",
                                     "VERSIONING"}
    assert stats.fault_kinds() == {fault}
    # one retry per request the proxy broke, and every attempt is a request
    assert fm.counter.total_retries == stats.total_faults
    assert fm.counter.total == sum(stats.requests.values())
    assert set(fm.counter.retries()) == {"GetObject", "HeadObject", "ListObjectsV2", "PutObject", "CopyObject",
                                         "DeleteObjects", "GetBucketVersioning"}


def test_a_conditional_put_answered_412_at_its_first_attempt_found_an_object_there_before(faulty_s3, s3_server,
                                                                                           bucket):
    """Each attempt is one send (botocore's attempts and aiohttp's resend off), so a 412 to the first one
    is someone else's object, even one holding the same bytes (a stopped backup's object, met by its re-run):
    ``FileExistsError`` at once, nothing read back. Local disk answers the same."""
    _direct(s3_server).put_object(Bucket=bucket, Key="root/objects/ab", Body=b"same bytes")
    fm, root = _fm(faulty_s3, bucket)
    with pytest.raises(FileExistsError):
        fm.write_bytes(f"{root}/objects/ab", b"same bytes", overwrite=False)
    assert fm.write_many([(f"{root}/objects/ab", b"same bytes"), (f"{root}/objects/cd", b"new")]) == [False, True]
    assert fm.counter.snapshot() == {"PutObject": 3}


def test_a_conditional_put_whose_reply_was_lost_is_our_own_write(faulty_s3, s3_server, bucket):
    fm, root = _fm(faulty_s3, bucket)
    faulty_s3.set_plan(FaultPlan(rate=1.0, faults=("lost-reply",), limit=1, requests=frozenset({"PUT-IF-NONE-MATCH"})))
    fm.write_bytes(f"{root}/journal/plan.json", b'{"plan": 1}', overwrite=False)  # stored; the retry gets 412
    assert _direct(s3_server).get_object(Bucket=bucket, Key="root/journal/plan.json")["Body"].read() == b'{"plan": 1}'
    assert faulty_s3.stats.faults == {("PUT-IF-NONE-MATCH", "lost-reply"): 1}
    assert fm.counter.retries() == {"PutObject": 1}
    assert fm.counter.snapshot() == {"PutObject": 2, "GetObject": 1}  # the retry's 412, then the content check

    # a real lost race stays one, lost replies or not: someone else's content is there
    faulty_s3.set_plan(FaultPlan(rate=1.0, faults=("lost-reply",), limit=1))
    _direct(s3_server).put_object(Bucket=bucket, Key="root/lease", Body=b"holder A")
    with pytest.raises(FileExistsError):
        fm.write_bytes(f"{root}/lease", b"holder B", overwrite=False)
    assert _direct(s3_server).get_object(Bucket=bucket, Key="root/lease")["Body"].read() == b"holder A"


def test_a_replace_if_same_refuses_a_newer_version_and_takes_its_own_lost_reply_as_done(faulty_s3, s3_server, bucket):
    """``replace_if_same`` (how leases renew) is one PUT with ``If-Match``: a retry refused because the
    first attempt was stored (its reply lost) is our own write; a record replaced or deleted since the
    version read is never overwritten."""
    direct = _direct(s3_server)
    direct.put_object(Bucket=bucket, Key="root/lease", Body=b"holder A, beat 1")
    fm, root = _fm(faulty_s3, bucket)
    assert fm.conditional_replace
    data, version = fm.read_versioned(f"{root}/lease")
    assert data == b"holder A, beat 1" and version

    def stored() -> bytes:
        return direct.get_object(Bucket=bucket, Key="root/lease")["Body"].read()

    faulty_s3.set_plan(FaultPlan(rate=1.0, faults=("lost-reply",), limit=1, requests=frozenset({"PUT"})))
    fm.replace_if_same(f"{root}/lease", b"holder A, beat 2", version)  # stored; the retry gets 412
    assert stored() == b"holder A, beat 2"
    assert faulty_s3.stats.faults == {("PUT", "lost-reply"): 1} and fm.counter.retries() == {"PutObject": 1}

    faulty_s3.calm()
    _, version = fm.read_versioned(f"{root}/lease")
    direct.put_object(Bucket=bucket, Key="root/lease", Body=b"holder B")  # taken over since
    with pytest.raises(FileChangedError):
        fm.replace_if_same(f"{root}/lease", b"holder A, beat 3", version)
    assert stored() == b"holder B"
    _, version = fm.read_versioned(f"{root}/lease")
    direct.delete_object(Bucket=bucket, Key="root/lease")  # broken since
    with pytest.raises(FileChangedError):
        fm.replace_if_same(f"{root}/lease", b"holder B, beat 2", version)
    assert _keys(s3_server, bucket) == []


def test_retried_deletes_and_copies_of_what_is_already_done(faulty_s3, s3_server, bucket):
    direct = _direct(s3_server)
    for i in range(3):
        direct.put_object(Bucket=bucket, Key=f"root/a/{i}", Body=str(i).encode())
    fm, root = _fm(faulty_s3, bucket)
    faulty_s3.set_plan(FaultPlan(rate=1.0, faults=("lost-reply",), limit=1))
    # each copy is done, its reply lost, done again; then the batch delete, the same
    assert fm.move_many([(f"{root}/a/{i}", f"{root}/b/{i}") for i in range(3)]) == []
    fm.delete_many([f"{root}/b/0"])  # gone on the first attempt; the retry deletes nothing, fine
    assert sorted(_keys(s3_server, bucket)) == ["root/b/1", "root/b/2"]
    assert faulty_s3.stats.faults == {("COPY", "lost-reply"): 3, ("DELETE-MULTI", "lost-reply"): 2}
    assert fm.counter.retries() == {"CopyObject": 3, "DeleteObjects": 2}


def test_a_retried_undelete_on_a_versioned_bucket(faulty_s3, s3_server, bucket):
    direct = _direct(s3_server)
    direct.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    for i in range(3):
        direct.put_object(Bucket=bucket, Key=f"root/v/{i}", Body=str(i).encode())
    fm, root = _fm(faulty_s3, bucket)
    paths = [f"{root}/v/{i}" for i in range(3)]
    fm.delete_many(paths)
    assert _keys(s3_server, bucket) == []
    faulty_s3.set_plan(FaultPlan(rate=1.0, faults=("lost-reply",), limit=1))
    assert fm.undelete_many(paths) == []  # the markers went on the first attempt; the retry finds them gone
    assert sorted(_keys(s3_server, bucket)) == [f"root/v/{i}" for i in range(3)]
    assert faulty_s3.stats.faulted_kinds() == {"LIST-VERSIONS", "DELETE-MULTI"}


def test_a_retried_listing_page_repeats_and_skips_nothing(faulty_s3, s3_server, bucket):
    from concurrent.futures import ThreadPoolExecutor

    direct = _direct(s3_server)
    keys = [f"root/state/{i // 100}/{i:05d}.delta" for i in range(2500)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: direct.put_object(Bucket=bucket, Key=k, Body=b""), keys))
    fm, root = _fm(faulty_s3, bucket)
    faulty_s3.set_plan(FaultPlan(rate=1.0, limit=2, faults=FAILING, requests=frozenset({"LIST"})))  # each page twice
    listed = [f.path for f in fm.walk(root)]
    assert len(listed) == len(set(listed)) == 2500 and sorted(listed) == sorted(f"{bucket}/{k}" for k in keys)
    assert fm.counter.retries() == {"ListObjectsV2": 6} and fm.counter.snapshot() == {"ListObjectsV2": 9}  # 3 pages


def test_not_found_is_never_retried(faulty_s3, bucket):
    fm, root = _fm(faulty_s3, bucket)
    with pytest.raises(FileNotFoundError):
        fm.read_bytes(f"{root}/missing")
    assert fm.info(f"{root}/missing") is None
    with pytest.raises(FileNotFoundError):
        with fm.open_read(f"{root}/missing") as f:
            f.read()
    assert fm.counter.retries() == {}
    assert fm.counter.snapshot()["GetObject"] == 2


def test_a_truncated_read_is_retried_never_parsed(faulty_s3, s3_server, bucket, monkeypatch):
    body = os.urandom(300_000)
    _direct(s3_server).put_object(Bucket=bucket, Key="root/big", Body=body)
    _direct(s3_server).put_object(Bucket=bucket, Key="root/empty", Body=b"")
    truncate_every_get = FaultPlan(rate=1.0, faults=("truncate",), requests=frozenset({"GET"}))
    # no retries: the short reply is an error, not a short file
    fm, root = _fm(faulty_s3, bucket, max_attempts=1)
    faulty_s3.set_plan(truncate_every_get)
    with pytest.raises(StoreUnavailableError, match="truncated"):
        fm.read_bytes(f"{root}/big")
    with pytest.raises(StoreUnavailableError, match="GetObject"):
        with fm.open_read(f"{root}/big") as f:
            f.read()
    # with retries, each cut reply is fetched again: whole objects, streamed ones in ranges too
    monkeypatch.setattr(direct_put, "_READ_BLOCK", 64 * 1024)  # five ranged GETs
    fm, root = _fm(faulty_s3, bucket)
    faulty_s3.set_plan(FaultPlan(rate=1.0, faults=("truncate",), requests=frozenset({"GET"}), limit=2))
    assert fm.read_bytes(f"{root}/big") == body
    with fm.open_read(f"{root}/big") as f:
        assert f.read(100) + f.read() == body
    with fm.open_read(f"{root}/empty") as f:
        assert f.read() == b""
    assert fm.counter.retries()["GetObject"] == 2 + 5 * 2 + 2  # whole, five ranges, the empty one: twice each
    assert "HeadObject" not in fm.counter.snapshot()  # streams read without a HEAD first


def test_a_streamed_read_never_mixes_two_versions(s3_server, bucket, monkeypatch):
    monkeypatch.setattr(direct_put, "_READ_BLOCK", 1000)
    direct = _direct(s3_server)
    direct.put_object(Bucket=bucket, Key="root/f", Body=b"a" * 3000)
    fm, root = open_file_manager(f"s3://{bucket}/root")
    with fm.open_read(f"{root}/f") as f:
        assert f.read(1000) == b"a" * 1000
        direct.put_object(Bucket=bucket, Key="root/f", Body=b"b" * 3000)
        with pytest.raises(OSError, match="replaced while it was being read"):
            f.read()


def test_a_streamed_read_seeks_like_a_local_file(s3_server, bucket, monkeypatch):
    """The ledger reads records at offsets of its segments: a stream from S3 seeks as a local file does
    (it failed with 'File or stream is not seekable' once segments were read at offsets)."""
    monkeypatch.setattr(direct_put, "_READ_BLOCK", 1000)
    body = bytes(range(256)) * 20  # 5,120 bytes: six ranged GETs
    _direct(s3_server).put_object(Bucket=bucket, Key="root/seg", Body=body)
    fm, root = open_file_manager(f"s3://{bucket}/root")
    with fm.open_read(f"{root}/seg") as f:
        assert f.seekable()
        assert f.read(10) == body[:10] and f.tell() == 10
        f.seek(4000)
        assert f.read(1050) == body[4000:5050] and f.tell() == 5050  # across a block boundary
        f.seek(3)
        assert f.readline() == body[3:body.index(b"\n", 3) + 1]
        f.seek(-20, os.SEEK_END)
        assert f.read() == body[-20:]
        f.seek(999)
        assert f.read(2) == body[999:1001]
    with fm.open_read(f"{root}/seg") as f:
        assert f.seek(0, os.SEEK_END) == len(body) and f.read() == b""


def test_an_outage_stops_a_request_with_a_clear_error(faulty_s3, bucket):
    fm, root = _fm(faulty_s3, bucket, max_attempts=4)
    faulty_s3.outage(30)
    try:
        with pytest.raises(StoreUnavailableError) as err:
            fm.write_bytes(f"{root}/offsets/412", b"v1", overwrite=False)
    finally:
        faulty_s3.clear()
    assert err.value.path == f"s3://{bucket}/root/offsets/412"
    assert "PutObject failed 4 time(s)" in err.value.problem
    assert "503 SlowDown" in err.value.problem or "connection" in err.value.problem
    assert fm.counter.retries() == {"PutObject": 3}


def test_a_multipart_upload_is_retried_whole_and_never_published_in_part(faulty_s3, s3_server, bucket, monkeypatch):
    monkeypatch.setattr(direct_put, "_SINGLE_PUT_MAX", 2**20)  # 12 MiB: two 8 MiB parts
    data = os.urandom(12 * 2**20)
    fm, root = _fm(faulty_s3, bucket)
    faulty_s3.set_plan(FaultPlan(rate=1.0, faults=("lost-reply", "503"), limit=1, requests=frozenset({"MULTIPART"})))
    fm.write_bytes(f"{root}/state/1.zip", data, overwrite=False)
    assert _direct(s3_server).get_object(Bucket=bucket, Key="root/state/1.zip")["Body"].read() == data
    assert fm.counter.retries().get("MultipartUpload")
    # the store goes down between the parts: nothing becomes visible, not even the first part
    fm, root = _fm(faulty_s3, bucket, max_attempts=2)
    faulty_s3.set_plan(FaultPlan())
    faulty_s3.outage(30, after_requests=2)  # the upload starts, one part goes, then nothing
    try:
        with pytest.raises(StoreUnavailableError):
            fm.write_bytes(f"{root}/state/2.zip", data, overwrite=True)
    finally:
        faulty_s3.clear()
    assert "root/state/2.zip" not in _keys(s3_server, bucket)


def test_aborting_leftover_uploads_is_retried_and_a_lost_reply_is_done(faulty_s3, s3_server, bucket):
    """``abort_uploads`` (what ``backup prune`` runs on a dead writer's multipart uploads) goes through the
    retry policy: a 503 SlowDown or a reset is tried again, and an abort whose reply was lost (done at the
    store, its retry answered NoSuchUpload) counts as done."""
    direct = _direct(s3_server)
    for i in range(4):
        upload = direct.create_multipart_upload(Bucket=bucket, Key=f"root/objects/{i}")
        direct.upload_part(Bucket=bucket, Key=f"root/objects/{i}", UploadId=upload["UploadId"], PartNumber=1,
                           Body=b"part")
    fm, root = _fm(faulty_s3, bucket)
    pending = fm.pending_uploads(root)
    assert sorted(u.path for u in pending) == [f"{root}/objects/{i}" for i in range(4)]
    faulty_s3.set_plan(FaultPlan(rate=1.0, limit=2, faults=("503", "lost-reply", "reset"),
                                 requests=frozenset({"MULTIPART"})))
    fm.abort_uploads(pending)
    assert direct.list_multipart_uploads(Bucket=bucket, Prefix="root/").get("Uploads", []) == []
    assert faulty_s3.stats.total_faults == 8  # each abort failed twice, then got through
    assert fm.counter.retries() == {"AbortMultipartUpload": 8}
    # the store keeps failing: a clear StoreUnavailableError, not a bare storage error
    upload = direct.create_multipart_upload(Bucket=bucket, Key="root/objects/late")
    fm, root = _fm(faulty_s3, bucket, max_attempts=3)
    left = fm.pending_uploads(root)
    faulty_s3.set_plan(FaultPlan(rate=1.0, faults=("503",), requests=frozenset({"MULTIPART"})))
    with pytest.raises(StoreUnavailableError, match="AbortMultipartUpload failed 3 time"):
        fm.abort_uploads(left)
    faulty_s3.set_plan(FaultPlan())
    assert [u["UploadId"] for u in direct.list_multipart_uploads(Bucket=bucket, Prefix="root/")["Uploads"]] == \
        [upload["UploadId"]]


# what the counter calls each request kind of the proxy
_COUNTED_AS = {"COPY": "CopyObject", "HEAD": "HeadObject", "LIST": "ListObjectsV2", "GET": "GetObject",
               "PUT": "PutObject", "PUT-IF-NONE-MATCH": "PutObject", "DELETE-MULTI": "DeleteObjects"}


def _by_counted_kind(counts) -> dict[str, int]:
    out: dict[str, int] = {}
    for kind, n in counts.items():
        kind = kind[0] if isinstance(kind, tuple) else kind
        out[_COUNTED_AS[kind]] = out.get(_COUNTED_AS[kind], 0) + n
    return out


def test_a_copy_is_one_request_per_attempt_and_completes_under_heavy_faults(faulty_s3, s3_server, bucket):
    """A copy is one CopyObject, retried on its own: no LIST or HEAD in the same attempt (s3fs's ``copy``
    sent four requests per attempt, and at 50% faults 8 of 40 copies ran out of attempts). What ``sink
    retain`` and compaction copy to their undo record must not stop at a fault rate one request rides out.

    20 attempts, not the default 10: the plan's draws depend on the bucket's name, which is new each run,
    and at 50% one of 40 copies fails 10 times in a row in about 1 run in 26 (CI hit it); 20 make that
    1 in 26,000, and 4 requests per attempt would still run out."""
    direct = _direct(s3_server)
    for i in range(40):
        direct.put_object(Bucket=bucket, Key=f"root/log/{i}", Body=f"entry {i}".encode())
    fm, root = _fm(faulty_s3, bucket, max_attempts=20, max_delay_s=0.2)
    faulty_s3.set_plan(FaultPlan(rate=0.5, faults=FAILING, seed=3))
    for i in range(40):
        fm.copy(f"{root}/log/{i}", f"{root}/trash/log/{i}")
    stats = faulty_s3.reset_stats()
    for i in range(40):
        assert direct.get_object(Bucket=bucket, Key=f"root/trash/log/{i}")["Body"].read() == f"entry {i}".encode()
    assert dict(stats.requests) == {"COPY": 40 + stats.total_faults}, stats.to_dict()
    assert stats.total_faults >= 10  # the plan did break many of them (fewer than 10 of 40+: 1 run in 200,000)
    assert fm.counter.snapshot() == {"CopyObject": 40 + stats.total_faults}
    assert fm.counter.retries() == {"CopyObject": stats.total_faults}


def test_retries_are_counted_by_the_request_that_failed(faulty_s3, s3_server, bucket):
    """``--json``'s retries by kind say which requests the store failed: a failed HEAD is a HeadObject retry,
    never a CopyObject one. Renames (HEAD, copy, delete), existence checks of missing files and moves, at 30%
    faults: the counter's retries and requests, by kind, are the proxy's own."""
    direct = _direct(s3_server)
    for i in range(12):
        direct.put_object(Bucket=bucket, Key=f"root/a/{i}", Body=str(i).encode())
    fm, root = _fm(faulty_s3, bucket, max_attempts=20)  # 31 requests at 30%: 10 attempts ran out 1 run in 5,600
    faulty_s3.set_plan(FaultPlan(rate=0.3, faults=FAILING, seed=1))
    for i in range(6):
        fm.rename(f"{root}/a/{i}", f"{root}/b/{i}")
        assert not fm.exists(f"{root}/none/{i}")
    assert fm.move_many([(f"{root}/a/{i}", f"{root}/c/{i}") for i in range(6, 12)]) == []
    stats = faulty_s3.reset_stats()
    assert sorted(_keys(s3_server, bucket)) == sorted([f"root/b/{i}" for i in range(6)] +
                                                      [f"root/c/{i}" for i in range(6, 12)])
    assert stats.total_faults > 0, stats.to_dict()
    assert fm.counter.retries() == _by_counted_kind(stats.faults)
    assert fm.counter.snapshot() == _by_counted_kind(stats.requests)
    assert "LIST" not in stats.requests  # one HEAD says a file is missing; a copy is one CopyObject


def test_a_copy_the_store_refuses_whole_is_copied_in_parts_each_retried_alone(faulty_s3, s3_server, bucket,
                                                                              monkeypatch):
    """S3 refuses a CopyObject of a source over 5 GiB (400 InvalidRequest): the copy goes in parts (HEAD,
    CreateMultipartUpload, UploadPartCopy per range, CompleteMultipartUpload), each request retried on its
    own; nothing is left open at the store."""
    monkeypatch.setattr(direct_put, "_COPY_PART_BYTES", 5 * 2**20)  # 12 MiB: parts of 5, 5 and 2 MiB
    data = os.urandom(12 * 2**20)
    direct = _direct(s3_server)
    direct.put_object(Bucket=bucket, Key="root/big", Body=data)
    fm, root = _fm(faulty_s3, bucket)
    # the COPY is refused as too large; every other request of the copy fails once (500), then goes through
    faulty_s3.set_plan(FaultPlan(rate=1.0, limit=1, faults=("copy-too-large",),
                                 requests=frozenset({"COPY", "HEAD", "MULTIPART"})))
    fm.copy(f"{root}/big", f"{root}/copied")
    assert direct.get_object(Bucket=bucket, Key="root/copied")["Body"].read() == data
    stats = faulty_s3.reset_stats()
    assert stats.requests == {"COPY": 1, "HEAD": 2, "MULTIPART": 10}, stats.to_dict()  # (create, 3 parts, complete) x 2
    assert fm.counter.retries() == {"HeadObject": 1, "CreateMultipartUpload": 1, "UploadPartCopy": 3,
                                    "CompleteMultipartUpload": 1}
    assert direct.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_an_endpoint_without_its_scheme_is_refused_naming_the_setting(monkeypatch, bucket):
    """``AWS_ENDPOINT_URL=127.0.0.1:9000`` (no http://) was an internal error with a traceback, from deep in
    botocore (a hostile review): now a bad-input error naming the variable or the option, before any request."""
    url = f"s3://{bucket}/ckpt"
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "127.0.0.1:9000")
    with pytest.raises(StorageError) as e:
        open_file_manager(url)
    assert "AWS_ENDPOINT_URL" in e.value.problem and e.value.path == url and "http://" in e.value.fix
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    for options in ({"endpoint_url": "localhost:9000"}, {"client_kwargs": {"endpoint_url": "ftp://host"}},
                    {"endpoint_url": "http://[::1"}, {"endpoint_url": "http://host:port"}):
        with pytest.raises(StorageError) as e:
            open_file_manager(url, options)
        assert "endpoint_url" in e.value.problem, e.value.problem


def test_a_client_failure_outside_an_operation_names_the_location_and_a_fix_in_json(monkeypatch, bucket, tmp_path):
    """An error of the object-store client that none of ours wraps (here: no credentials at all) printed a bare
    "storage error" and --json without the documented path and fix (a hostile review). A command given several
    locations names none of them (the second review: it named the local checkpoint for a failing S3 sink)."""
    from benchmarks import synthetic
    from tests.helpers import cli_json

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    url = f"s3://{bucket}/no-credentials"
    code, r = cli_json("inspect", url, "--storage-options", '{"endpoint_url": "http://127.0.0.1:9"}')
    assert code == 2 and set(r) >= {"error", "path", "problem", "fix"}, r
    assert r["path"] == url and "credentials" in r["problem"] and "credentials" in r["fix"], r
    ckpt = str(tmp_path / "ckpt")
    synthetic.write_local(ckpt, batches=3, partitions=1, retain_state=3)
    code, r = cli_json("fsck", ckpt, "--sink", url, "--storage-options", '{"endpoint_url": "http://127.0.0.1:9"}')
    assert code == 2 and r["path"] is None and "credentials" in r["problem"], r


def test_a_missing_bucket_among_several_locations_is_named_with_the_fix_of_its_command(s3_server, tmp_path):
    """``backup create CKPT s3://nosuchbucket/bk`` said "storage error: The specified bucket does not exist" with
    no path, and a fix about resume and undo, which do not finish a backup (a hostile review). The bucket an S3
    "no such bucket" reply names picks the location given in it; a backup's fix says to run it again."""
    from benchmarks import synthetic
    from tests.helpers import cli_json

    ckpt = str(tmp_path / "ckpt")
    synthetic.write_local(ckpt, batches=3, partitions=1, retain_state=3)
    dest = "s3://no-such-bucket-here/backups"
    code, r = cli_json("backup", "create", ckpt, dest, "--storage-options", json.dumps({"endpoint_url": s3_server}))
    assert code == 2 and r["error"] == "StorageError", r
    assert r["path"] == dest and r["problem"] == "no such bucket: 'no-such-bucket-here'", r
    assert "running the same command again" in r["fix"] and "resume" not in r["fix"], r

    # a restore into a bucket that does not exist: it says to create the bucket, not to resume or undo (nothing
    # of the restore can be there, and neither command would make the bucket)
    options = ("--storage-options", json.dumps({"endpoint_url": s3_server}))
    local = str(tmp_path / "backups")
    code, made = cli_json("backup", "create", ckpt, local)
    assert code == 0, made
    target = "s3://no-such-bucket-here/restored"
    code, r = cli_json("backup", "restore", local, made["backup_id"], target, "--yes", *options)
    assert code == 2 and r["error"] == "StorageError", r
    assert r["path"] == target and r["problem"] == "no such bucket: 'no-such-bucket-here'", r
    assert "create the bucket 'no-such-bucket-here' first" in r["fix"] and "nothing was restored" in r["fix"], r
    assert "resume" not in r["fix"] and "undo" not in r["fix"], r
    # into the root of a missing bucket: where to restore once it exists (a bucket root is refused then)
    code, r = cli_json("backup", "restore", local, made["backup_id"], "s3://no-such-bucket-here", "--yes", *options)
    assert code == 2 and "restore into a prefix in it (s3://no-such-bucket-here/NAME)" in r["fix"], r
    # the destination's bucket missing (a typo in both): the destination is named, and no bucket is to be created
    for target in ("s3://no-such-bucket-here/restored", str(tmp_path / "restored")):
        code, r = cli_json("backup", "restore", "s3://no-such-bucket-here/backups", made["backup_id"], target, "--yes",
                           *options)
        assert code == 2 and r["path"] == "s3://no-such-bucket-here/backups", r
        assert "backup destination's bucket" in r["fix"] and "create the bucket" not in r["fix"], r
        assert "resume" not in r["fix"] and "nothing was restored" in r["fix"], r
    assert not os.path.exists(tmp_path / "restored")
    # a command that only reads changed nothing: no resume or undo in its fix (a hostile review: fsck advised both)
    for command in (("fsck",), ("inspect",), ("history",)):
        code, r = cli_json(*command, "s3://no-such-bucket-here/ck", *options)
        assert code == 2 and r["problem"] == "no such bucket: 'no-such-bucket-here'", (command, r)
        assert "resume" not in r["fix"] and "undo" not in r["fix"], (command, r)


def _self_signed(tmp_path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 that nobody signed, and its key (PEM files)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_file), str(key_file)


def test_a_tls_handshake_no_retry_changes_is_refused_at_once_naming_the_endpoint(s3_server, bucket, tmp_path,
                                                                                 monkeypatch):
    """``https://`` to a server that speaks plain HTTP, or to one whose certificate nobody trusts, was retried
    as an outage (10 attempts, about 10 s) and reported as "connection error" without naming the endpoint (a
    hostile review). Now one attempt, a ``StorageError`` naming the endpoint and what to check; with the
    certificate's authority in ``AWS_CA_BUNDLE``, as the fix says, the handshake passes. A refused connection
    is still retried (a store restarting), and the error names the endpoint it tried."""
    import socket
    import ssl
    import threading

    url = f"s3://{bucket}/ckpt"
    plain = s3_server.replace("http://", "https://")
    fm, root = open_file_manager(url, {"endpoint_url": plain})
    with pytest.raises(StorageError) as e:
        fm.exists(f"{root}/metadata")
    assert not isinstance(e.value, StoreUnavailableError)
    assert f"at {plain}:" in e.value.problem and "does not speak TLS" in e.value.problem, e.value.problem
    assert "http://" in e.value.fix and e.value.path == f"{url}/metadata"
    assert fm.counter.snapshot() == {"HeadObject": 1} and fm.counter.retries() == {}

    cert, key = _self_signed(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve():  # completes handshakes, then hangs up: enough to tell a trusted certificate from one that is not
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                context.wrap_socket(conn, server_side=True).close()
            except (OSError, ssl.SSLError):
                conn.close()

    threading.Thread(target=serve, daemon=True).start()
    endpoint = f"https://127.0.0.1:{port}"
    try:
        fm, root = open_file_manager(url, {"endpoint_url": endpoint})
        with pytest.raises(StorageError) as e:
            fm.exists(f"{root}/metadata")
        assert not isinstance(e.value, StoreUnavailableError)
        assert f"at {endpoint}:" in e.value.problem and "certificate is not trusted" in e.value.problem, \
            e.value.problem
        assert "AWS_CA_BUNDLE" in e.value.fix
        monkeypatch.setenv("AWS_CA_BUNDLE", cert)
        fm, root = open_file_manager(url, {"endpoint_url": endpoint, "retry": {"max_attempts": 2}})
        with pytest.raises(StoreUnavailableError) as e:  # trusted now: the server hanging up is an outage
            fm.exists(f"{root}/metadata")
        assert f"endpoint {endpoint})" in e.value.problem, e.value.problem
    finally:
        listener.close()

    listener = socket.create_server(("127.0.0.1", 0))
    closed = f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()  # nothing listens there now
    fm, root = open_file_manager(url, {"endpoint_url": closed, "retry": {"max_attempts": 2, "max_delay_s": 0.01}})
    with pytest.raises(StoreUnavailableError) as e:
        fm.exists(f"{root}/metadata")
    assert f"(last: connection refused; endpoint {closed})" in e.value.problem, e.value.problem
