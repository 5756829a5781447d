"""A checkpoint on S3 as S3A leaves it: a directory marker (an empty object whose key ends in ``/``) for every
directory Spark made (``ckpt/offsets/``, ``ckpt/state/0/3/``...). Hadoop 3.4's S3A keeps them by default
(``fs.s3a.directory.marker.retention``), and the S3 console's "create folder" makes one.

Each marker was listed as a file with an empty name: every command on a stateful checkpoint (inspect, fsck,
backup create, rollback) stopped with an internal error (IndexError in the state model). A marker is a
directory now, as S3A lists it. Spark writes the checkpoint, it goes to the S3 server with its markers, our
commands run there, and Spark resumes from what the rollback left with exactly the expected output.
"""

from __future__ import annotations

import os
import shutil

import boto3
import s3fs

from tests.helpers import cli_json
from tests.test_rollback_s3 import v2_run  # noqa: F401  (a fixture)
from tests.test_rollback_spark import INTERVALS, exact, finish_and_read, target_before_last_compaction


def upload_as_s3a_leaves_it(run, bucket: str, endpoint: str) -> str:
    """The checkpoint's files, and a marker for each of its directories: the URL."""
    s3fs.S3FileSystem(endpoint_url=endpoint).put(run.checkpoint + "/", f"{bucket}/ckpt", recursive=True)
    s3 = boto3.client("s3", endpoint_url=endpoint)
    for d, _, _ in os.walk(run.checkpoint):
        rel = os.path.relpath(d, run.checkpoint)
        s3.put_object(Bucket=bucket, Key="ckpt/" if rel == "." else f"ckpt/{rel}/", Body=b"")
    return f"s3://{bucket}/ckpt"


def download_files(run, bucket: str, endpoint: str) -> None:
    """The objects under ``ckpt/`` back into the local checkpoint (markers become the directories they mark)."""
    s3 = boto3.client("s3", endpoint_url=endpoint)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="ckpt/"):
        for o in page.get("Contents", []):
            local = os.path.join(run.checkpoint, o["Key"][len("ckpt/"):])
            os.makedirs(local if o["Key"].endswith("/") else os.path.dirname(local), exist_ok=True)
            if not o["Key"].endswith("/"):
                with open(local, "wb") as f:
                    f.write(s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read())


def test_a_checkpoint_with_s3a_directory_markers_is_read_backed_up_and_rolled_back(spark, v2_run, bucket, s3_server,
                                                                                   tmp_path):
    run = v2_run
    url = upload_as_s3a_leaves_it(run, bucket, s3_server)
    markers = [k for page in boto3.client("s3", endpoint_url=s3_server).get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix="ckpt/") for k in (o["Key"] for o in page.get("Contents", [])) if k.endswith("/")]
    assert any(k.startswith("ckpt/state/0/") and k.count("/") >= 4 for k in markers), markers  # a store's own

    code, shown = cli_json("inspect", url, *INTERVALS)
    assert code == 0 and shown["last_committed_batch"] == run.last_batch, shown
    code, local = cli_json("inspect", run.checkpoint, *INTERVALS)  # the same state stores as on disk
    assert code == 0 and shown["state"] == local["state"] and shown["state"], (shown["state"], local["state"])
    code, shown = cli_json("fsck", url, *INTERVALS)
    assert (code, shown["findings"]) == (0, []), shown

    dest = str(tmp_path / "dest")
    code, made = cli_json("backup", "create", url, dest, *INTERVALS)
    assert code == 0, made
    assert not [f for f in made.get("skipped_names", []) if f.endswith("/")], made
    code, verified = cli_json("backup", "verify", dest)
    assert code == 0, verified

    n = target_before_last_compaction(run)
    code, r = cli_json("rollback", url, "--to-batch", n, "--sink", run.output, *INTERVALS, "--yes")
    assert code == 0, r
    assert r["result"]["target_batch"] == n, r
    code, shown = cli_json("fsck", url, *INTERVALS)
    assert (code, shown["findings"]) == (0, []), shown

    # Spark resumes from what the rollback left (brought down as S3A would read it) with exactly the output
    shutil.rmtree(run.checkpoint)
    download_files(run, bucket, s3_server)
    assert finish_and_read(spark, run) == exact(run)


def test_undo_of_a_restore_on_s3_removes_the_markers_it_emptied(tmp_path, s3_server, bucket):
    """Markers S3A left in a restored target (Spark made ``state/0/0/`` there) stay after the undo took the
    restore's files away, and S3A lists each as an empty directory: Spark refuses a new query (a hostile review;
    on local disk the undo removes the directories it emptied). Undo removes the markers of the directories it
    emptied, and no other. Fast: ``benchmarks.synthetic`` (Spark's names and formats, with state), no Spark."""
    from benchmarks.synthetic import write_local

    ckpt = str(tmp_path / "ckpt")
    write_local(ckpt, batches=25, partitions=2, retain_state=10, retain_log=100)
    code, made = cli_json("backup", "create", ckpt, str(tmp_path / "dest"))
    assert code == 0, made
    url = f"s3://{bucket}/t/ckpt"
    code, r = cli_json("backup", "restore", str(tmp_path / "dest"), made["backup_id"], url, "--yes")
    assert code == 0, r
    s3 = boto3.client("s3", endpoint_url=s3_server)
    for key in ("t/ckpt/", "t/ckpt/offsets/", "t/ckpt/commits/", "t/ckpt/sources/0/", "t/ckpt/state/", "t/ckpt/state/0/",
                "t/ckpt/state/0/0/", "t/ckpt/mine/"):  # as S3A leaves them; mine/ is no directory the restore made
        s3.put_object(Bucket=bucket, Key=key, Body=b"")
    code, r = cli_json("undo", url, "--yes")
    assert code == 0, r
    left = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="t/ckpt/").get("Contents", []))
    assert left == ["t/ckpt/", "t/ckpt/mine/"], left


def test_many_emptied_directories_cost_one_listing_not_one_each(s3_server, bucket):
    """A sink's partition directories are each a top directory: undo listed them one round trip at a time (500
    partitions, 500 LISTs; a second hostile review). Beyond a few, one listing of the directory they share."""
    from checkpoint_ops.storage import open_file_manager

    s3 = boto3.client("s3", endpoint_url=s3_server)
    for i in range(40):
        s3.put_object(Bucket=bucket, Key=f"out/date={i}/", Body=b"")
    s3.put_object(Bucket=bucket, Key="out/date=0/keep.parquet", Body=b"PAR1")
    s3.put_object(Bucket=bucket, Key="out/", Body=b"")
    fm, root = open_file_manager(f"s3://{bucket}/out")
    fm.counter.reset()
    fm.remove_dirs_if_empty([f"{root}/date={i}" for i in range(40)])
    assert fm.counter.snapshot().get("ListObjectsV2", 0) == 1, fm.counter.snapshot()
    left = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="out/").get("Contents", []))
    assert left == ["out/", "out/date=0/", "out/date=0/keep.parquet"], left
