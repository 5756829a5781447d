"""``rerun_inputs.find_missing``: which input files a file-source log names are gone, one listing per directory;
files on another store are counted as not checked. Local and on the S3 server."""

from __future__ import annotations

import boto3

from checkpoint_ops.rerun_inputs import find_missing, missing_warning
from checkpoint_ops.storage import open_file_manager


def test_local_files_gone_are_found_one_listing_per_directory(tmp_path):
    for rel in ("in/a.json", "in/p=1/b.json", "in/with space.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}\n")
    fm, _ = open_file_manager(str(tmp_path))
    urls = [f"file://{tmp_path}/in/a.json", f"file://{tmp_path}/in/gone.json", f"file://{tmp_path}/in/p=1/b.json",
            f"file://{tmp_path}/in/p=2/c.json", f"file://{tmp_path}/in/with%20space.json", "s3a://elsewhere/x.json"]
    before = fm.counter.snapshot()
    found = find_missing(fm, urls)
    spent = {k: v - before.get(k, 0) for k, v in fm.counter.snapshot().items() if v != before.get(k, 0)}
    assert spent == {"list": 3}, spent  # in/, in/p=1/, in/p=2/ (not there)
    assert found.missing == [f"file://{tmp_path}/in/gone.json", f"file://{tmp_path}/in/p=2/c.json"]
    assert found.looked == 5 and found.unchecked == 1
    warning = missing_warning("sources/0", [7, 8], 10, found)
    assert warning.startswith("sources/0: 2 of the 5 input files batches 7..8 read are no longer where"), warning
    assert "the files of the 8 later rolled-back batches were not looked for" in warning, warning
    assert "later rolled-back" not in missing_warning("sources/0", [7], 1, found)
    assert missing_warning("sources/0", [7], 1, find_missing(fm, urls[:1])) is None


def test_objects_gone_are_found_on_the_s3_server(s3_server, bucket):
    s3 = boto3.client("s3", endpoint_url=s3_server)
    s3.put_object(Bucket=bucket, Key="in/a.json", Body=b"{}\n")
    fm, _ = open_file_manager(f"s3://{bucket}/ckpt", {"endpoint_url": s3_server})
    before = fm.counter.snapshot()
    found = find_missing(fm, [f"s3a://{bucket}/in/a.json", f"s3a://{bucket}/in/b.json", "file:///tmp/x.json"])
    assert fm.counter.snapshot() == {**before, "ListObjectsV2": before.get("ListObjectsV2", 0) + 1}
    assert found.missing == [f"s3a://{bucket}/in/b.json"] and found.looked == 2 and found.unchecked == 1
