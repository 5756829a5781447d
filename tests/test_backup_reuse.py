"""What an incremental backup reuses, and what it must not (fast tier: synthetic checkpoints, no Spark).

* An object the last verification found bad, or one that is missing or of the wrong size, is stored
  again by the next backup instead of being named as it is (a backup that cannot be repaired otherwise).
* A file changed without its size and modification time changing (``cp -p``, ``touch -r``, a coarse
  clock tick; a uniquely named file rewritten) is read again: its inode and ctime on local disk, and any
  file modified within ``RACY_S`` of the previous backup's listing.
* A stray file whose name a manifest cannot hold is left out with a warning (outside Spark's folders) or
  refused (inside them): a backup never publishes a manifest its own reader rejects.
* A big object copied by reflink holds exactly the bytes its hash names, even if its source grew.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time

import boto3
import pytest

from benchmarks import synthetic
from checkpoint_ops.backup import create_backup
from checkpoint_ops.storage import open_file_manager, rename
from tests.helpers import cli, cli_json

LONG_AGO = time.time() - 3600  # files written this long ago are not "racily clean" (create.RACY_S)
UUID_NAME = "state/0/0/SSTs/000123-0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b.sst"


def checkpoint(root: str) -> str:
    """A synthetic checkpoint of 5 batches (Spark's names and formats), every file written long ago."""
    synthetic.write_local(root, batches=5, partitions=2, retain_state=5)
    age(root)
    return root


def age(root: str, when: float = LONG_AGO) -> None:
    for d, _, names in os.walk(root):
        for n in names:
            os.utime(os.path.join(d, n), (when, when))


def backup(ckpt: str, dest: str) -> dict:
    code, r = cli_json("backup", "create", ckpt, dest)
    assert code == 0, r
    return r


def restored(dest: str, backup_id: str, target: str) -> str:
    code, r = cli_json("backup", "restore", dest, backup_id, target, "--yes")
    assert code == 0, r
    return target


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def same_size_edit(path: str) -> bytes:
    """Rewrite an offsets file with other bytes of the same length (its batch's time a millisecond later)."""
    data = read(path)
    i = data.index(b'"batchTimestampMs":') + len(b'"batchTimestampMs":') + 12  # the last of 13 digits
    new = data[:i] + str((int(chr(data[i])) + 1) % 10).encode() + data[i + 1:]
    with open(path, "wb") as f:
        f.write(new)
    return new


# ---- objects found bad, missing or of the wrong size ------------------------------------------------------


class Objects:
    """The objects of a destination, seen from outside our code (a local directory or a bucket prefix)."""

    def __init__(self, url: str, endpoint: str | None = None):
        self.url = url
        self.endpoint = endpoint

    def _key(self, sha: str) -> tuple[str, str]:
        bucket, _, prefix = self.url[len("s3://"):].partition("/")
        return bucket, f"{prefix}/objects/{sha[:2]}/{sha}"

    def write(self, sha: str, data: bytes) -> None:
        if self.endpoint is None:
            with open(f"{self.url}/objects/{sha[:2]}/{sha}", "wb") as f:
                f.write(data)
        else:
            bucket, key = self._key(sha)
            boto3.client("s3", endpoint_url=self.endpoint).put_object(Bucket=bucket, Key=key, Body=data)

    def remove(self, sha: str) -> None:
        if self.endpoint is None:
            os.remove(f"{self.url}/objects/{sha[:2]}/{sha}")
        else:
            bucket, key = self._key(sha)
            boto3.client("s3", endpoint_url=self.endpoint).delete_object(Bucket=bucket, Key=key)


@pytest.fixture(params=["local", "s3"])
def dest(request, tmp_path) -> Objects:
    if request.param == "local":
        return Objects(str(tmp_path / "dest"))
    endpoint, bucket = request.getfixturevalue("s3_server"), request.getfixturevalue("bucket")
    return Objects(f"s3://{bucket}/backups", endpoint)


def test_an_object_the_last_verification_found_bad_is_stored_again(dest, tmp_path):
    ckpt = checkpoint(str(tmp_path / "ck"))
    first = backup(ckpt, dest.url)
    good = read(f"{ckpt}/offsets/4")
    sha = hashlib.sha256(good).hexdigest()
    dest.write(sha, b"garbage")  # bit rot in one object
    assert cli_json("backup", "verify", dest.url)[0] == 1

    again = backup(ckpt, dest.url)
    assert again["parent"] == first["backup_id"]
    assert again["read_files"] == 1 and again["repaired_objects"] == 1, again  # only the file of the bad object
    assert read(f"{restored(dest.url, again['backup_id'], str(tmp_path / 'r'))}/offsets/4") == good
    code, r = cli_json("backup", "verify", dest.url)
    assert code == 0 and r["ok"], r  # the first backup holds the same content: good again too

    third = backup(ckpt, dest.url)  # the verification is older than its parent now: nothing is stored again
    assert third["read_files"] == 0 and third["repaired_objects"] == third["new_objects"] == 0, third


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_reused_object_that_is_missing_or_of_the_wrong_size_is_stored_again(dest, tmp_path, damage):
    """No verification ran: the next backup sees it while it looks for what it reuses (one stat each on
    local disk; one listing of the objects on an object store, not a HEAD each)."""
    ckpt = checkpoint(str(tmp_path / "ck"))
    backup(ckpt, dest.url)
    good = read(f"{ckpt}/offsets/4")
    sha = hashlib.sha256(good).hexdigest()
    dest.remove(sha) if damage == "missing" else dest.write(sha, good[:-1])

    again = backup(ckpt, dest.url)
    assert again["read_files"] == 1, again
    assert (again["new_objects"], again["repaired_objects"]) == ((1, 0) if damage == "missing" else (0, 1)), again
    assert read(f"{restored(dest.url, again['backup_id'], str(tmp_path / 'r'))}/offsets/4") == good
    if dest.endpoint is not None:
        assert "HeadObject" not in again["requests"], again["requests"]


# ---- files changed without their size and modification time changing -------------------------------------


def test_a_file_changed_under_its_old_modification_time_is_read_again(tmp_path):
    """``cp -p``, ``touch -r`` and ``rsync -a`` carry a file's modification time over; its inode and
    ctime change (no user sets those). A uniquely named file rewritten at the same size is compared by
    its modification time too."""
    ckpt = checkpoint(str(tmp_path / "ck"))
    unique = f"{ckpt}/{UUID_NAME}"
    os.makedirs(os.path.dirname(unique), exist_ok=True)
    with open(unique, "wb") as f:
        f.write(b"AAAAAAAA")
    age(ckpt)
    dest = str(tmp_path / "dest")
    backup(ckpt, dest)

    offsets = f"{ckpt}/offsets/4"
    edited = same_size_edit(offsets)
    os.utime(offsets, (LONG_AGO, LONG_AGO))  # touch -r: the old modification time
    with open(unique, "wb") as f:
        f.write(b"BBBBBBBB")
    os.utime(unique, (LONG_AGO + 1, LONG_AGO + 1))

    again = backup(ckpt, dest)
    assert again["read_files"] == 2, again
    back = restored(dest, again["backup_id"], str(tmp_path / "r"))
    assert read(f"{back}/offsets/4") == edited and read(f"{back}/{UUID_NAME}") == b"BBBBBBBB"
    assert backup(ckpt, dest)["read_files"] == 0  # nothing changed since: nothing is read


def test_a_file_rewritten_within_one_tick_of_the_listing_is_read_again(s3_server, bucket, faulty_s3, tmp_path):
    """On S3 a modification time has whole seconds and no user sets it: a file rewritten at the same size
    within the second the previous backup listed it keeps it. Such a file ("racily clean") is read again.

    The store's clock is held still for the file (``FaultyS3.hold_clock``) from its first version's write
    until its second's, as a one-second clock is when both come within one tick: a backup in between need
    not fit within that second (on a loaded machine it does not). Only its listing must, as on S3."""
    s3 = boto3.client("s3", endpoint_url=s3_server)
    local = checkpoint(str(tmp_path / "ck"))
    for d, _, names in os.walk(local):
        for n in names:
            path = os.path.join(d, n)
            s3.put_object(Bucket=bucket, Key=f"ck/{os.path.relpath(path, local)}", Body=read(path))
    ckpt, old = f"s3://{bucket}/ck", read(f"{local}/offsets/4")
    new = same_size_edit(f"{local}/offsets/4")
    via_proxy = {"endpoint_url": faulty_s3.endpoint}
    for attempt in range(10):
        dest = str(tmp_path / f"dest{attempt}")
        faulty_s3.clear()
        time.sleep(1 - time.time() % 1)
        s3.put_object(Bucket=bucket, Key="ck/offsets/4", Body=old)
        first = s3.head_object(Bucket=bucket, Key="ck/offsets/4")["LastModified"]
        faulty_s3.hold_clock({f"{bucket}/ck/offsets/4": first})
        parent = create_backup(ckpt, dest, storage_options=via_proxy)
        with open(os.path.join(dest, "manifests", f"{parent['backup_id']}.json")) as f:
            listed_at = json.load(f)["listed_at"]
        if listed_at < first.timestamp() + 1:  # the listing came within the tick of the first version's write
            break
    else:
        pytest.fail("in ten backups, the listing of the checkpoint never began within a second of its start: "
                    "the case this test builds (a listing within the tick of a file's write) never happened")
    s3.put_object(Bucket=bucket, Key="ck/offsets/4", Body=new)  # within the same tick: the clock is held
    proxied = boto3.client("s3", endpoint_url=faulty_s3.endpoint)
    seen = proxied.head_object(Bucket=bucket, Key="ck/offsets/4")
    assert (seen["LastModified"], seen["ContentLength"]) == (first, len(old)), seen  # size and time as listed
    again = create_backup(ckpt, dest, storage_options=via_proxy)
    assert again["read_files"] >= 1, again
    assert read(f"{restored(dest, again['backup_id'], str(tmp_path / 'r'))}/offsets/4") == new


# ---- names a manifest cannot hold ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a:b", "notes\\old", "x\ny"])
def test_a_stray_file_whose_name_a_manifest_cannot_hold_is_left_out_with_a_warning(tmp_path, name):
    ckpt, dest = checkpoint(str(tmp_path / "ck")), str(tmp_path / "dest")
    with open(os.path.join(ckpt, name), "wb") as f:
        f.write(b"hello")
    code, out, err = cli("backup", "create", ckpt, dest)
    assert code == 0, err
    assert "WARNING: left out" in out and repr(os.path.join(ckpt, name)) in out, out
    code, r = cli_json("backup", "list", dest)
    (row,) = r["backups"]
    assert code == 0 and row["status"] == "unverified" and row["damaged"] is None, r
    back = restored(dest, row["id"], str(tmp_path / "r"))
    assert not os.path.exists(os.path.join(back, name)) and read(f"{back}/offsets/4") == read(f"{ckpt}/offsets/4")
    code, r = cli_json("backup", "create", ckpt, dest)
    assert r["skipped_names"] == [{"root": "checkpoint", "file": name, "url": os.path.join(ckpt, name),
                                   "problem": r["skipped_names"][0]["problem"]}]


def test_a_name_a_manifest_cannot_hold_inside_sparks_folders_is_refused(tmp_path):
    ckpt, dest = checkpoint(str(tmp_path / "ck")), str(tmp_path / "dest")
    odd = os.path.join(ckpt, "state", "0", "x\\y")
    with open(odd, "wb") as f:
        f.write(b"hello")
    code, out, err = cli("backup", "create", ckpt, dest)
    assert code == 2 and odd in err and "rename it" in err, (out, err)
    assert not os.path.exists(dest)


# ---- big objects copied in the kernel ------------------------------------------------------------------------


def test_a_reflinked_object_whose_source_grew_holds_exactly_the_bytes_its_hash_names(tmp_path, monkeypatch):
    """FICLONE shares every extent of the source as it is when cloned. This machine's ext4 has no
    reflinks: the ioctl (the kernel's, not ours) is emulated as btrfs and XFS do it, the source growing
    between the size ``copy_in`` took and the clone."""
    os.makedirs(tmp_path / "src")
    src, content = str(tmp_path / "src" / "big"), b"A" * 1000
    with open(src, "wb") as f:
        f.write(content)
    real_ioctl = fcntl.ioctl

    def reflinking_ioctl(fd, request, arg, *rest):
        if request != rename.FICLONE:
            return real_ioctl(fd, request, arg, *rest)
        with open(src, "ab") as f:
            f.write(b"B" * 24)
        os.ftruncate(fd, 0)
        os.copy_file_range(arg, fd, os.fstat(arg).st_size, 0, 0)
        return 0

    monkeypatch.setattr(fcntl, "ioctl", reflinking_ioctl)
    source, _ = open_file_manager(str(tmp_path / "src"))
    target, _ = open_file_manager(str(tmp_path / "dst"))
    target.hadoop_crc = False
    sha = hashlib.sha256(content).hexdigest()
    assert target.copy_in(source, src, str(tmp_path / "dst" / sha), sha256=sha)
    assert read(str(tmp_path / "dst" / sha)) == content


def test_an_object_found_bad_is_stored_again_by_the_first_backup_of_another_checkpoint(dest, tmp_path):
    """Two checkpoints share content (commit files, schemas): an object a verification of the first one's
    backup found bad is stored again by the FIRST backup of the second one, which has no parent to learn it
    from, instead of being named as it is (a manifest naming it seals it for every later backup)."""
    first = checkpoint(str(tmp_path / "a"))
    backup(first, dest.url)
    good = read(f"{first}/commits/0")
    sha = hashlib.sha256(good).hexdigest()
    dest.write(sha, b"garbage")
    assert cli_json("backup", "verify", dest.url)[0] == 1

    second = checkpoint(str(tmp_path / "b"))
    assert read(f"{second}/commits/0") == good
    b = backup(second, dest.url)
    assert b["parent"] is None and b["repaired_objects"] == 1, b
    code, r = cli_json("backup", "verify", dest.url)
    assert code == 0 and r["ok"], r  # both backups whole again
    assert backup(second, dest.url)["repaired_objects"] == 0  # stored again once, not at every backup


def test_a_backup_killed_before_its_manifest_leaves_the_bad_mark(tmp_path):
    """An object marked bad that a backup stores again is no longer bad only once the manifest naming it is
    published (then it is durable): killed at any mutating call before that, the mark stays, so the next
    backup stores it again too; the one that finishes clears it."""
    import subprocess
    import sys

    dest = str(tmp_path / "dest")
    first = checkpoint(str(tmp_path / "a"))
    backup(first, dest)
    sha = hashlib.sha256(read(f"{first}/commits/0")).hexdigest()
    os.remove(f"{dest}/objects/{sha[:2]}/{sha}")
    assert cli_json("backup", "verify", dest)[0] == 1
    mark = f"{dest}/bad/{sha}"
    assert os.path.exists(mark)
    second = checkpoint(str(tmp_path / "b"))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for kill_at in range(1, 500):
        env = {**os.environ, "CHECKPOINT_OPS_KILL_AT": str(kill_at), "PYTHONPATH": root}
        code = subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", "backup", "create", second, dest],
                              env=env, cwd=root, capture_output=True).returncode
        published = [n for n in os.listdir(f"{dest}/manifests") if not n.startswith(".")]
        if code == 0:
            break
        assert code == -9, (kill_at, code)
        if len(published) == 1:  # killed before this backup's manifest
            assert os.path.exists(mark), kill_at
    else:
        raise AssertionError("the backup never finished")
    assert kill_at > 5, (kill_at, code)  # the matrix reached the backup's writes
    assert not os.path.exists(mark)
    assert cli_json("backup", "verify", dest)[0] == 0


def test_backup_create_reports_each_file_manager_once(faulty_s3, s3_server, bucket, tmp_path):
    """A checkpoint on S3 and its ledger beside it share one file manager: ``--json`` reports its retries
    once (under ``checkpoint``), and they add up to the faults the proxy injected (the ledger's copy of the
    same counter doubled them before)."""
    import s3fs

    from tests.faulty_s3 import FaultPlan

    local = checkpoint(str(tmp_path / "src" / "ckpt"))
    code, out, err = cli("ledger", "sync", local)
    assert code == 0, err
    s3fs.S3FileSystem(endpoint_url=s3_server).put(str(tmp_path / "src") + "/", f"{bucket}/src", recursive=True)
    url = f"s3://{bucket}/src/ckpt"
    assert boto3.client("s3", endpoint_url=s3_server).list_objects_v2(
        Bucket=bucket, Prefix="src/.checkpoint-ops/ckpt/ledger/")["KeyCount"] > 0
    faulty_s3.set_plan(FaultPlan(rate=0.3, faults=("500", "503"), requests=frozenset({"GET"}), limit=1, seed=7))
    code, r = cli_json("backup", "create", url, str(tmp_path / "dest"), "--storage-options",
                       f'{{"endpoint_url": "{faulty_s3.endpoint}"}}')
    faulty_s3.calm()
    assert code == 0, r
    assert set(r["retries"]) == {"destination", "checkpoint"}, r["retries"]
    injected = faulty_s3.stats.total_faults
    assert injected > 0 and sum(r["retries"]["checkpoint"].values()) == injected, (r["retries"], injected)


def test_a_backup_run_again_after_a_stop_counts_what_the_stopped_run_stored_as_already_there(
        faulty_s3, s3_server, bucket, tmp_path):
    """A backup the store stopped part-way is run again, as its error says. The re-run finds the objects the
    stopped run stored (a conditional PUT answered 412 on its first attempt: there before): it neither
    reads them back nor reports them as new, so ``new_objects`` is what the re-run created (a hostile
    review: every object was read back and counted new again). Restored, the backup is the checkpoint."""
    ckpt = checkpoint(str(tmp_path / "ckpt"))
    dest = f"s3://{bucket}/dest"
    options = ["--storage-options", f'{{"endpoint_url": "{faulty_s3.endpoint}", "retry": {{"max_attempts": 2}}}}']
    faulty_s3.outage(60, after_requests=10, of_kind="PUT-IF-NONE-MATCH")
    try:
        code, r = cli_json("backup", "create", ckpt, dest, *options)
    finally:
        faulty_s3.calm()
    assert code != 0 and "run the same command again" in r["fix"], r
    s3 = boto3.client("s3", endpoint_url=s3_server)

    def objects() -> set[str]:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="dest/objects/")
        return {o["Key"] for page in pages for o in page.get("Contents", [])}

    before = objects()
    assert len(before) >= 5, before  # the objects the stopped run stored (its intent was one of the 10 PUTs)
    code, r = cli_json("backup", "create", ckpt, dest, *options)
    assert code == 0, r
    created = objects() - before
    assert r["new_objects"] == len(created) > 0, (r["new_objects"], len(created))
    assert r["new_bytes"] == sum(s3.head_object(Bucket=bucket, Key=k)["ContentLength"] for k in created)
    assert r["requests"]["GetObject"] == 1, r["requests"]  # the repository's marker; no object read back
    restored(dest, r["backup_id"], str(tmp_path / "back"))
    for d, _, names in os.walk(ckpt):
        for n in names:
            rel = os.path.relpath(os.path.join(d, n), ckpt)
            assert read(os.path.join(tmp_path, "back", rel)) == read(os.path.join(d, n)), rel
