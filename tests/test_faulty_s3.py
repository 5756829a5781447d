"""The fault proxy itself (tests/faulty_s3.py): each fault looks to an S3 client as it should, an outage
fails everything and ends, decisions follow the seed, and every kind of request we make is recognised.

Clients here are plain boto3 with retries off, so each fault is seen exactly as injected.
"""

from __future__ import annotations

import boto3
import botocore.exceptions
import pytest
from botocore.config import Config

from tests.faulty_s3 import FaultPlan, request_kind


def _client(endpoint: str):
    return boto3.client("s3", endpoint_url=endpoint, config=Config(retries={"total_max_attempts": 1}))


def _direct(s3_server):
    return boto3.client("s3", endpoint_url=s3_server)


BODY = bytes(range(256)) * 40  # 10,240 bytes


def test_each_fault_reaches_the_client_as_that_failure(faulty_s3, s3_server, bucket):
    _direct(s3_server).put_object(Bucket=bucket, Key="k/object", Body=BODY)
    s3 = _client(faulty_s3.endpoint)

    def get_with(fault: str):
        faulty_s3.set_plan(FaultPlan(rate=1.0, faults=(fault,), limit=1))
        return s3.get_object(Bucket=bucket, Key="k/object")["Body"].read()

    for fault in ("reset", "lost-reply"):
        with pytest.raises(botocore.exceptions.ConnectionClosedError):
            get_with(fault)
    for fault, status, code in (("500", 500, "InternalError"), ("503", 503, "SlowDown")):
        with pytest.raises(botocore.exceptions.ClientError) as err:
            get_with(fault)
        assert err.value.response["Error"]["Code"] == code  # S3's XML error body, parsed
        assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == status
    # a cut body keeps its Content-Length: the client notices, it never gets a short object
    with pytest.raises((botocore.exceptions.ResponseStreamingError, botocore.exceptions.IncompleteReadError)):
        get_with("truncate")
    assert get_with("slow") == BODY
    # limit=1: the same request goes through the second time
    assert s3.get_object(Bucket=bucket, Key="k/object")["Body"].read() == BODY
    stats = faulty_s3.reset_stats()
    assert stats.faults == {("GET", f): 1 for f in ("reset", "lost-reply", "500", "503", "truncate", "slow")}


def test_a_lost_reply_happened_on_the_server(faulty_s3, s3_server, bucket):
    s3 = _client(faulty_s3.endpoint)
    faulty_s3.set_plan(FaultPlan(rate=1.0, faults=("lost-reply",), limit=1))
    with pytest.raises(botocore.exceptions.ConnectionClosedError):
        s3.put_object(Bucket=bucket, Key="k/new", Body=b"stored", IfNoneMatch="*")
    assert _direct(s3_server).get_object(Bucket=bucket, Key="k/new")["Body"].read() == b"stored"
    # the client's retry of that conditional PUT is refused: the object it wrote itself is there
    with pytest.raises(botocore.exceptions.ClientError) as err:
        s3.put_object(Bucket=bucket, Key="k/new", Body=b"stored", IfNoneMatch="*")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412


def test_an_outage_fails_every_request_until_it_ends(faulty_s3, s3_server, bucket):
    _direct(s3_server).put_object(Bucket=bucket, Key="k/object", Body=b"x")
    s3 = _client(faulty_s3.endpoint)
    faulty_s3.outage(1.0, after_requests=1)
    assert s3.get_object(Bucket=bucket, Key="k/object")["Body"].read() == b"x"  # the one let through
    failed = 0
    for _ in range(4):
        with pytest.raises((botocore.exceptions.ClientError, botocore.exceptions.ConnectionClosedError)):
            s3.head_object(Bucket=bucket, Key="k/object")
        failed += 1
    faulty_s3.wait_outage_over()
    assert s3.get_object(Bucket=bucket, Key="k/object")["Body"].read() == b"x"
    assert failed == 4 and faulty_s3.stats.fault_kinds() == {"reset", "503"}


def test_decisions_follow_the_seed(faulty_s3, s3_server, bucket):
    direct = _direct(s3_server)
    for i in range(30):
        direct.put_object(Bucket=bucket, Key=f"k/{i}", Body=b"x")
    s3 = _client(faulty_s3.endpoint)

    def outcomes(seed: int) -> list[bool]:
        faulty_s3.set_plan(FaultPlan(rate=0.5, faults=("503",), seed=seed))
        out = []
        for i in range(30):
            try:
                s3.head_object(Bucket=bucket, Key=f"k/{i}")
                out.append(True)
            except botocore.exceptions.ClientError:
                out.append(False)
        return out

    first = outcomes(7)
    assert outcomes(7) == first and 2 < first.count(False) < 28  # (the bucket's name is new each run: 1 in 10^6)
    assert outcomes(8) != first


def test_only_the_chosen_requests_fail(faulty_s3, s3_server, bucket):
    _direct(s3_server).put_object(Bucket=bucket, Key="k/object", Body=b"x")
    s3 = _client(faulty_s3.endpoint)
    faulty_s3.set_plan(FaultPlan(rate=1.0, faults=("503",), requests=frozenset({"HEAD"})))
    assert s3.get_object(Bucket=bucket, Key="k/object")["Body"].read() == b"x"
    for _ in range(3):  # no limit: fails every time
        with pytest.raises(botocore.exceptions.ClientError):
            s3.head_object(Bucket=bucket, Key="k/object")


def test_every_kind_of_request_we_make_is_recognised(faulty_s3, s3_server, bucket):
    direct = _direct(s3_server)
    direct.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    s3 = _client(faulty_s3.endpoint)
    s3.put_object(Bucket=bucket, Key="k/a", Body=b"a")
    s3.put_object(Bucket=bucket, Key="k/b", Body=b"b", IfNoneMatch="*")
    s3.get_object(Bucket=bucket, Key="k/a")["Body"].read()
    s3.head_object(Bucket=bucket, Key="k/a")
    s3.list_objects_v2(Bucket=bucket, Prefix="k/")
    s3.copy_object(Bucket=bucket, Key="k/c", CopySource={"Bucket": bucket, "Key": "k/a"})
    s3.delete_object(Bucket=bucket, Key="k/c")
    s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "k/b"}], "Quiet": True})
    s3.get_bucket_versioning(Bucket=bucket)
    s3.list_object_versions(Bucket=bucket, Prefix="k/")
    assert set(faulty_s3.stats.requests) == {"PUT", "PUT-IF-NONE-MATCH", "GET", "HEAD", "LIST", "COPY", "DELETE",
                                             "DELETE-MULTI", "VERSIONING", "LIST-VERSIONS"}
    assert request_kind("POST", "/b/k?uploads", {}) == request_kind("PUT", "/b/k?partNumber=1&uploadId=x", {}) \
        == "MULTIPART"
