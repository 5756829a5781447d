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
