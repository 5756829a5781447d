"""A log entry whose name Spark parses as a batch but is not that batch's name (``offsets/+0``, ``_spark_metadata/
+24``): what Spark does with each is proven in ``test_misnamed_batch_files_spark.py``; here, the commands that
change a sink log refuse, on local disk and S3 alike, and a checkpoint holding only ``offsets/+0`` is named as
what it is. Fast tier: ``benchmarks.check_pass.Stream``, no Spark."""

from __future__ import annotations

import os
import shutil

import boto3
import pytest
import s3fs

from benchmarks.check_pass import INTERVAL
from tests.helpers import cli_json, tree_snapshot
from tests.test_rollback_directory_as_batch import I, _stream


@pytest.mark.parametrize("command", [
    ["sink", "compact"],
    ["sink", "retain", "--keep-after-batch", "20"],
    ["sink", "orphans", "--min-age", "0s", "--delete"],
])
def test_a_misnamed_sink_log_file_stops_every_change_to_the_sink_log(tmp_path, command):
    s = _stream(str(tmp_path))
    log = os.path.join(s.out, "_spark_metadata")
    newest = max((n for n in os.listdir(log) if not n.startswith(".")), key=lambda n: int(n.split(".")[0]))
    shutil.copy2(os.path.join(log, newest), os.path.join(log, "+" + newest))
    before = tree_snapshot(s.ckpt, s.out)
    code, r = cli_json(*command[:2], s.out, "--checkpoint", s.ckpt, "--sink-compact-interval", str(INTERVAL),
                       *command[2:], "--yes")
    assert code == 2, r
    assert r["path"] == os.path.join(log, "+" + newest) and "which is there" in r["problem"], r
    assert "the change to the sink log is refused, nothing was changed" in r["problem"], r
    assert tree_snapshot(s.ckpt, s.out) == before


def test_offsets_plus_0_alone_is_named_not_taken_for_a_new_query(tmp_path):
    """Spark lists ``offsets/+0`` as batch 0 (so it is no new query) and fails to read ``offsets/0``; fsck said the
    location blocks a new query (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY), which Spark never gets to."""
    s = _stream(str(tmp_path), batches=1)
    for name in os.listdir(s.ckpt):
        if name not in ("metadata", "offsets"):
            shutil.rmtree(os.path.join(s.ckpt, name))
    for old, new in (("0", "+0"), (".0.crc", ".+0.crc")):
        os.rename(os.path.join(s.ckpt, "offsets", old), os.path.join(s.ckpt, "offsets", new))
    code, r = cli_json("fsck", s.ckpt)
    assert code == 1, r
    assert [(f["code"], os.path.basename(f["path"])) for f in r["findings"]] == [("misnamed-batch-file", "+0")], r
    assert "File offsets/0 does not exist" in r["findings"][0]["problem"], r
    assert "rename it to offsets/0" in r["findings"][0]["fix"], r


def test_on_s3_a_misnamed_offsets_file_is_named_and_the_rollback_refused(tmp_path, s3_server, bucket):
    s = _stream(str(tmp_path))
    os.rename(os.path.join(s.ckpt, "offsets", "24"), os.path.join(s.ckpt, "offsets", "024"))
    s3fs.S3FileSystem(endpoint_url=s3_server).put(s.ckpt + "/", f"{bucket}/ckpt", recursive=True)
    where = f"s3://{bucket}/ckpt"
    code, r = cli_json("fsck", where, *I)
    assert code == 1 and [f["path"] for f in r["findings"] if f["code"] == "misnamed-batch-file"] == \
        [f"{where}/offsets/024"], r
    keys = sorted(o["Key"] for o in boto3.client("s3", endpoint_url=s3_server).list_objects_v2(
        Bucket=bucket, Prefix="ckpt/")["Contents"])
    code, r = cli_json("rollback", where, "--to-batch", "20", *I, "--yes")
    assert code == 2 and r["path"] == f"{where}/offsets/024" and "which is missing" in r["problem"], r
    assert sorted(o["Key"] for o in boto3.client("s3", endpoint_url=s3_server).list_objects_v2(
        Bucket=bucket, Prefix="ckpt/")["Contents"]) == keys
