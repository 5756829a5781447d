"""Backup destinations that survive crashes and damage, on local disk and on the S3 server.

* A backup killed with SIGKILL leaves an intent whose holder is dead: it no longer holds garbage
  collection; the next prune says so, removes it, and collects what the dead backup stored.
* A running backup (a live intent) does hold it, and a dead prune's lock no longer makes backups wait:
  each side writes its marker before it looks for the other's, and only live markers count.
* Leftovers of interrupted writes (temp files; on S3, multipart uploads) are removed by prune when no
  writer can own them any more, and listed in its plan.
* A damaged manifest is listed as damaged; every other backup stays listable, verifiable and
  restorable (Spark resumes from the restore), new backups proceed, and object collection waits.
* ``backup list`` shows the last verification's outcome, failures included.

The bad-input rows (unusable sources, each kind of damaged manifest) are in test_bad_input_corpus.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass

import boto3
import pytest
import s3fs

from checkpoint_ops.backup import Repository, plan_backup_prune
from checkpoint_ops.backup.claims import HeldClaim, INTENT
from checkpoint_ops.backup.create import RACY_S
from checkpoint_ops.liveness import pid_running
from checkpoint_ops.storage import direct_put
from checkpoint_ops.storage.rename import is_temp_name
from pipelines.event_counts import flush_files, read_output, write_event_files
from tests.crash import ForkRunner
from tests.helpers import cli, cli_json
from tests.test_backup_spark import backup, exact, resume_at
from tests.test_rollback_spark import INTERVALS

HDFS = pytest.mark.parametrize("flavour", ["hdfs"])
STEADY = {"CHECKPOINT_OPS_LEASE_TTL": "600"}  # no heartbeat renewal lands among a killed run's counted calls


@dataclass
class Dest:
    """A backup destination, seen from outside our code: a local directory or a prefix in a bucket."""

    url: str
    local: str | None = None
    endpoint: str | None = None
    bucket: str | None = None
    prefix: str = "backups"

    def _s3(self):
        return boto3.client("s3", endpoint_url=self.endpoint)

    def files(self) -> dict[str, int]:
        """rel -> size of every file (hidden ones included)."""
        if self.local is not None:
            return {os.path.relpath(os.path.join(d, n), self.local): os.path.getsize(os.path.join(d, n))
                    for d, _, names in os.walk(self.local) for n in names}
        out, token = {}, None
        while True:
            kw = {"Bucket": self.bucket, "Prefix": self.prefix + "/", **({"ContinuationToken": token} if token else {})}
            resp = self._s3().list_objects_v2(**kw)
            out.update({o["Key"][len(self.prefix) + 1:]: o["Size"] for o in resp.get("Contents", [])})
            if not resp.get("IsTruncated"):
                return out
            token = resp["NextContinuationToken"]

    def under(self, top: str) -> set[str]:
        return {rel for rel in self.files() if rel.startswith(top + "/")}

    def objects(self) -> set[str]:
        return {rel for rel in self.under("objects") if not is_temp_name(rel.rsplit("/", 1)[-1])}

    def temps(self) -> set[str]:
        return {rel for rel in self.files() if is_temp_name(rel.rsplit("/", 1)[-1])}

    def read(self, rel: str) -> bytes:
        if self.local is not None:
            with open(os.path.join(self.local, rel), "rb") as f:
                return f.read()
        return self._s3().get_object(Bucket=self.bucket, Key=f"{self.prefix}/{rel}")["Body"].read()

    def write(self, rel: str, data: bytes) -> None:
        if self.local is not None:
            with open(os.path.join(self.local, rel), "wb") as f:
                f.write(data)
        else:
            self._s3().put_object(Bucket=self.bucket, Key=f"{self.prefix}/{rel}", Body=data)

    def remove(self, rel: str) -> None:
        if self.local is not None:
            os.remove(os.path.join(self.local, rel))
        else:
            self._s3().delete_object(Bucket=self.bucket, Key=f"{self.prefix}/{rel}")

    def uploads(self) -> list[str]:
        """Keys (relative) of the multipart uploads never completed or aborted (S3 only)."""
        resp = self._s3().list_multipart_uploads(Bucket=self.bucket, Prefix=self.prefix + "/")
        return [u["Key"][len(self.prefix) + 1:] for u in resp.get("Uploads", [])]

    def snapshot(self) -> dict[str, bytes]:
        return {rel: self.read(rel) for rel in self.files()}


@pytest.fixture(params=["local", "s3"])
def dest(request, tmp_path) -> Dest:
    if request.param == "local":
        return Dest(str(tmp_path / "dest"), local=str(tmp_path / "dest"))
    endpoint, bucket = request.getfixturevalue("s3_server"), request.getfixturevalue("bucket")
    return Dest(f"s3://{bucket}/backups", endpoint=endpoint, bucket=bucket)


@pytest.fixture(scope="module")
def runner():
    r = ForkRunner()
    yield r
    r.close()


def wait_for(condition, what: str) -> None:
    """Poll until ``condition()`` holds (a guard against hanging, not a measure of speed)."""
    deadline = time.monotonic() + 300
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.1)


def new_content(run) -> None:
    """Something new for the next backup to store, without running Spark: the batch ledger."""
    code, out, err = cli("ledger", "sync", run.checkpoint, "--sink", run.output, *INTERVALS)
    assert code == 0, err


def killed_backup(runner, run, dest: Dest, kill_at: int) -> dict:
    """``backup create`` SIGKILLed just before its ``kill_at``-th mutating call; returns its intent."""
    before = dest.under("intents")
    code, out, err = runner.run("backup", "create", run.checkpoint, dest.url, "--sink", run.output, *INTERVALS,
                                kill_at=kill_at, env=STEADY)
    assert code == -9, (out, err)
    (rel,) = dest.under("intents") - before
    return {"rel": rel, **json.loads(dest.read(rel))}


def prune(dest: Dest, *extra) -> dict:
    code, r = cli_json("backup", "prune", dest.url, "--keep-last", "1", *extra)
    assert code == 0, r
    return r


def restore_and_resume(spark, run, dest: Dest, backup_id: str, where, files: int) -> None:
    """Restore into new directories (input copied and relocated); Spark resumes there and the output
    is exactly that of an uninterrupted run over ``files`` input files."""
    inp, out, ckpt = str(where / "in"), str(where / "out"), str(where / "ckpt")
    shutil.copytree(run.input, inp)
    code, r = cli_json("backup", "restore", dest.url, backup_id, ckpt, "--sink-target", out,
                       "--relocate", f"{run.input}={inp}", "--yes")
    assert code == 0, r
    flush_files(inp, files)
    resume_at(spark, run.flavour, inp, out, ckpt)
    assert read_output(spark, out) == exact(files)


# ---- local destinations: batched stores and kernel copies -------------------------------------------------


def _stored(d: Dest, backup_id: str) -> tuple[dict, dict[str, bytes]]:
    """A backup's manifest roots (path, hash, size, mtime of every file) and the objects they name."""
    roots = json.loads(d.read(f"manifests/{backup_id}.json"))["roots"]
    shas = {e[1] for r in roots.values() for e in r["files"]}
    return roots, {sha: d.read(f"objects/{sha[:2]}/{sha}") for sha in shas}


@HDFS
def test_a_local_backup_stores_exactly_what_the_one_file_at_a_time_path_stores(spark, run, tmp_path, monkeypatch):
    """To local disk a backup reads, hashes and stores runs of files on several threads (``write_many``),
    and copies big files in the kernel (``copy_in``). Its manifest and objects are exactly those of the
    generic path (the fsspec ``rename`` strategy: one ``create_atomic`` per object, streamed copies), no
    temp file is left, and Spark resumes from a restore of it with exactly the uninterrupted output."""
    from checkpoint_ops.backup import create

    batched = Dest(str(tmp_path / "batched"), local=str(tmp_path / "batched"))
    streamed = Dest(str(tmp_path / "streamed"), local=str(tmp_path / "streamed"))
    generic = Dest(str(tmp_path / "generic"), local=str(tmp_path / "generic"))
    monkeypatch.setattr(create, "LOCAL_BATCH", 3)  # many runs of files, interleaved on the threads
    monkeypatch.setattr(create, "BATCH_BYTES", 4096)  # several stores per run
    b = backup(run, batched.url)
    monkeypatch.setattr(create, "_BIG", 0)  # every non-empty file is a "big" one: kernel copy, hash checked
    s = backup(run, streamed.url)
    monkeypatch.undo()
    monkeypatch.setenv("CHECKPOINT_OPS_FILE_MANAGER", "rename")
    g = backup(run, generic.url)
    monkeypatch.delenv("CHECKPOINT_OPS_FILE_MANAGER")
    reference = _stored(generic, g["backup_id"])
    assert _stored(batched, b["backup_id"]) == reference
    assert _stored(streamed, s["backup_id"]) == reference
    for d in (batched, streamed):
        assert d.temps() == set()
        assert {rel.rsplit("/", 1)[-1] for rel in d.objects()} == set(reference[1])
    assert b["new_objects"] == s["new_objects"] == g["new_objects"] == len(reference[1])
    assert b["requests"].get("copy_file_range", 0) == 0 and sum(
        s["requests"].get(k, 0) for k in ("reflink", "copy_file_range", "sendfile", "read/write")) > 0
    restore_and_resume(spark, run, streamed, s["backup_id"], tmp_path / "restored", run.files)


# ---- local destinations: objects created in place, trusted only once a manifest seals them ----------------


def _damaged_objects(d: Dest) -> set[str]:
    """Objects whose stored bytes do not hash to their name (part-written, truncated)."""
    return {rel for rel in d.objects() if hashlib.sha256(d.read(rel)).hexdigest() != rel.rsplit("/", 1)[-1]}


_REWRITTEN = re.compile(r"^(sources/[^/]+/\d+(\.compact)?|_spark_metadata/\d+(\.compact)?|state/\d+/_metadata/v2/\d+)$")


@HDFS
@pytest.mark.parametrize("path", ["in memory", "streamed"])
def test_a_part_written_object_is_checked_and_replaced_before_a_backup_names_it(spark, run, runner, tmp_path,
                                                                                monkeypatch, path):
    """To local disk a backup creates its objects in place (no temp file, no rename), so one killed before
    its manifest leaves the object it was creating part-written under its name, and a machine that dies
    can leave others truncated. No manifest names them, so the next backup trusts none of them: it reads
    each back, replaces the damaged ones atomically (``repaired_objects``), and the result verifies,
    restores byte for byte and Spark resumes from it exactly. ``streamed``: every file goes through the big
    file path (``copy_in``), which replaces a damaged object the same way."""
    from checkpoint_ops.backup import create

    dest = Dest(str(tmp_path / "dest"), local=str(tmp_path / "dest"))
    create_args = ("backup", "create", run.checkpoint, dest.url, "--sink", run.output, *INTERVALS)
    # mutating calls: the pairing records beside the checkpoint and the sink, the destination's marker (5 in
    # all), the intent, then one per object created; killed at the 10th, the fourth object is there, empty
    code, out, err = runner.run(*create_args, kill_at=10, env=STEADY)
    assert code == -9, (out, err)
    assert not dest.under("manifests") and not dest.temps()
    (killed,) = _damaged_objects(dest)
    assert dest.read(killed) == b""
    # and one whole object no manifest names, truncated under its name (what a machine that dies before the
    # sync can leave)
    whole = max(dest.objects() - {killed}, key=lambda rel: len(dest.read(rel)))
    data = dest.read(whole)
    dest.write(whole, data[:len(data) // 2])
    assert _damaged_objects(dest) == {killed, whole}

    if path == "streamed":
        monkeypatch.setattr(create, "_BIG", 0)
    code, r = cli_json(*create_args)
    assert code == 0, r
    assert r["parent"] is None and r["repaired_objects"] == 2 and not r["skipped_vanished"]
    monkeypatch.undo()
    assert _damaged_objects(dest) == set() and not dest.temps()
    code, text, err = cli(*create_args)  # the next one finds them whole and sealed: nothing to replace
    assert code == 0 and "replaced" not in text, (text, err)
    code, v = cli_json("backup", "verify", dest.url)
    assert code == 0 and v["ok"] and v["objects_checked"] == len(dest.objects())

    # restored byte for byte (the logs a restore relocates are checked by Spark's resume instead)
    roots = json.loads(dest.read(f"manifests/{r['backup_id']}.json"))["roots"]
    inp, out, ckpt = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ckpt")
    shutil.copytree(run.input, inp)
    code, rr = cli_json("backup", "restore", dest.url, r["backup_id"], ckpt, "--sink-target", out,
                        "--relocate", f"{run.input}={inp}", "--yes")
    assert code == 0, rr
    compared = set()
    for rid, source, target in (("checkpoint", run.checkpoint, ckpt), ("sink0", run.output, out)):
        for rel, sha, *_ in roots[rid]["files"]:
            if _REWRITTEN.match(rel):
                continue
            with open(os.path.join(target, rel), "rb") as f, open(os.path.join(source, rel), "rb") as g:
                assert f.read() == g.read(), rel
            compared.add(sha)
    assert {killed.rsplit("/", 1)[-1], whole.rsplit("/", 1)[-1]} <= compared
    if path == "in memory":
        flush_files(inp, run.files)
        resume_at(spark, run.flavour, inp, out, ckpt)
        assert read_output(spark, out) == exact(run.files)


@HDFS
def test_objects_a_manifest_names_are_not_read_again_and_others_are_read_once(spark, run, tmp_path):
    """Counted at the destination's file manager: a file read again from the source (its modification time
    changed, its content did not) whose object the parent backup names costs no read of that object; an
    object that is there but no manifest names (left by a backup that died) is read back once, and kept."""
    dest = Dest(str(tmp_path / "dest"), local=str(tmp_path / "dest"))
    backup(run, str(tmp_path / "first"))  # records the pairing beside the sink and in the ledger
    time.sleep(RACY_S)  # a file written within RACY_S of a backup's listing is read again by the next one
    b1 = backup(run, dest.url)
    sealed = str(tmp_path / "sealed")
    shutil.copytree(dest.local, sealed)

    def backup_of_copy(name: str) -> dict:
        """A backup to a copy of the destination as b1 left it."""
        d = str(tmp_path / name)
        shutil.copytree(sealed, d)
        return backup(run, d)

    untouched = backup_of_copy("untouched")
    assert untouched["read_files"] == 0
    later = time.time() + 60
    for d, _, names in os.walk(run.checkpoint):
        for n in names:
            os.utime(os.path.join(d, n), (later, later))
    touched = backup_of_copy("touched")
    assert touched["read_files"] > 0 and touched["new_objects"] == 0, touched
    assert touched["requests"].get("read", 0) == untouched["requests"].get("read", 0), (touched, untouched)

    new_content(run)  # content no backup holds yet
    fresh = backup_of_copy("fresh")
    assert fresh["new_objects"] > 0 and fresh["repaired_objects"] == 0
    # the same backup where a dead backup had already stored those objects, whole, and published nothing
    left = str(tmp_path / "left")
    shutil.copytree(sealed, left)
    sealed_objects = Dest(sealed, local=sealed).objects()
    planted = Dest(str(tmp_path / "fresh"), local=str(tmp_path / "fresh")).objects() - sealed_objects
    assert len(planted) == fresh["new_objects"]
    for rel in planted:
        os.makedirs(os.path.dirname(os.path.join(left, rel)), exist_ok=True)
        shutil.copy2(os.path.join(tmp_path / "fresh", rel), os.path.join(left, rel))
    again = backup(run, left)
    assert again["new_objects"] == 0 and again["repaired_objects"] == 0
    assert again["requests"]["read"] == fresh["requests"]["read"] + len(planted), (again, fresh)
    assert again["parent"] == fresh["parent"] == b1["backup_id"]
    assert cli_json("backup", "verify", left)[0] == 0


# ---- a killed backup -------------------------------------------------------------------------------------


@HDFS
def test_a_killed_backup_no_longer_holds_garbage_collection(spark, run, dest, runner, tmp_path):
    b1 = backup(run, dest.url)
    kept = dest.objects()
    new_content(run)
    # killed at its 3rd mutating call: its intent, one new object stored, the next write interrupted
    intent = killed_backup(runner, run, dest, kill_at=3)
    holder = intent["holder"]
    assert not pid_running(holder["pid"], holder["pid_start"])
    orphans = dest.objects() - kept
    assert orphans, "the killed backup stored an object no manifest references"
    temps = dest.temps()
    assert bool(temps) == (dest.local is not None), temps  # on S3 an interrupted PUT leaves nothing

    code, listed = cli_json("backup", "list", dest.url)  # the destination stays usable
    assert code == 0 and [b["id"] for b in listed["backups"]] == [b1["backup_id"]]

    # young temp files may still be a writer's: kept at the default age
    before = dest.snapshot()
    dry = prune(dest, "--dry-run")["plan"]
    assert dest.snapshot() == before
    rels = {a["rel"] for a in dry["actions"]}
    assert intent["rel"] in rels and not rels & temps
    assert f"pid {holder['pid']} on this host) is gone" in dry["summary"]["stale claims"][0]
    assert orphans <= rels
    if temps:
        assert f"{len(temps)} younger than 3600 s kept" in dry["summary"]["leftovers"]

    # old enough (here: any age), with no backup running: every leftover goes, listed in the plan first
    dry = prune(dest, "--temp-min-age", "0s", "--dry-run")["plan"]
    assert temps <= {a["rel"] for a in dry["actions"]}
    r = prune(dest, "--temp-min-age", "0s", "--yes")["result"]
    assert r == {"manifests_deleted": 0, "objects_deleted": len(orphans), "bytes_deleted": r["bytes_deleted"],
                 "objects_deferred": False, "claims_removed": 1, "leftovers_removed": len(temps), "note": None,
                 "requests": r["requests"], "retries": {}}
    assert r["requests"]  # what the destination was asked, by kind (none had to be retried)
    assert not dest.under("intents") and not dest.temps() and dest.objects() == kept
    assert cli_json("backup", "verify", dest.url)[0] == 0

    # the next backup stores again what the dead one had stored, and restores exactly
    b2 = backup(run, dest.url)
    assert b2["parent"] == b1["backup_id"] and dest.objects() >= orphans
    restore_and_resume(spark, run, dest, b2["backup_id"], tmp_path, run.files)


# ---- a running backup, a dead prune ---------------------------------------------------------------------


@HDFS
def test_a_running_backup_holds_collection_and_a_dead_prune_holds_nothing(spark, run, dest, runner):
    b1 = backup(run, dest.url)
    write_event_files(run.input, run.files, run.files + 2)  # more batches: Spark's cleanup makes some of
    run.run_query(spark)  # b1's files (and so objects) its alone
    b2 = backup(run, dest.url)
    assert cli_json("backup", "verify", dest.url, b2["backup_id"])[0] == 0
    repo = Repository.open(dest.url)
    only_b1 = repo.manifest(b1["backup_id"]).hashes() - repo.manifest(b2["backup_id"]).hashes()
    assert only_b1

    # a prune killed after taking its lock, before it deletes b1's manifest. Mutating calls: the destination's
    # lease (on local disk a temp write, then its put-if-absent link: 2 calls), the prune lock, the manifest
    kill_at = 4 if dest.local is not None else 3
    code, out, err = runner.run("backup", "prune", dest.url, "--keep-last", "1", "--yes", kill_at=kill_at, env=STEADY)
    assert code == -9, (out, err)
    (dead,) = repo.locks()
    assert not dead.live and "is gone" in dead.stale and repo.prune_locks() == []
    b3 = backup(run, dest.url)  # its dead lock makes no backup wait (this one would wait, then give up)

    # a live prune lock does make a backup wait; its intent, written first, makes a prune leave objects alone
    held = repo.hold_prune_lock()
    done = []
    waiting = threading.Thread(target=lambda: done.append(backup(run, dest.url)))
    waiting.start()
    try:
        wait_for(lambda: [c for c in repo.intents() if c.live], "the waiting backup's intent")
        assert not done, "a backup must wait while a live prune holds its lock"
        (running,) = [c for c in repo.intents() if c.live]
        r = prune(dest, "--temp-min-age", "0s", "--yes")
        summary, result = r["plan"]["summary"], r["result"]
        assert summary["delete"] == [b1["backup_id"]] and summary["running"] == [running.describe()]
        assert summary["objects"].startswith("left for the next prune: a backup is being taken")
        assert not [a for a in r["plan"]["actions"] if a["rel"].startswith("objects/")]
        assert dead.rel in {a["rel"] for a in r["plan"]["actions"]} and result["claims_removed"] == 1
        assert (result["manifests_deleted"], result["objects_deleted"], result["objects_deferred"]) == (1, 0, True)
        assert running.backup_id in result["note"]
        assert {f"objects/{h[:2]}/{h}" for h in only_b1} <= dest.objects()
    finally:
        held.release()
        waiting.join()
    assert done and done[0]["parent"] == b3["backup_id"]
    assert not dest.under("locks") and not dest.under("intents")

    # alone, the next prune collects what only b1 held
    r = prune(dest, "--yes")["result"]
    assert (r["objects_deferred"], r["objects_deleted"]) == (False, len(only_b1))
    assert not {f"objects/{h[:2]}/{h}" for h in only_b1} & dest.objects()
    code, v = cli_json("backup", "verify", dest.url)
    assert code == 0 and [b["backup_id"] for b in v["backups"]] == [b2["backup_id"], done[0]["backup_id"]]


def test_a_claim_whose_heartbeat_lapsed_is_stale_and_its_holder_knows(tmp_path, monkeypatch):
    """Another host's backup, or a hung one, is judged by its heartbeat; a holder that was late itself
    refuses to go on (a prune may have collected the objects it reuses)."""
    repo = Repository.open(str(tmp_path / "dest"), create=True)
    held = repo.hold_intent("20260101T000000.000000Z-0000abcd", "/some/checkpoint")
    try:
        (live,) = repo.intents()
        assert live.live and repo.live_intents() == {"20260101T000000.000000Z-0000abcd": set()}
        later = time.time() + held.holder.ttl_s + 1
        (lapsed,) = repo.intents(now=later)
        assert "last heartbeat" in lapsed.stale
        plan = plan_backup_prune(repo, keep_last=1, now=later)
        assert [a.rel for a in plan.actions] == [live.rel] and plan.summary["objects"].startswith("0 unreferenced")
        plan = plan_backup_prune(repo, keep_last=1)
        assert plan.summary["running"] == [live.describe()] and not plan.actions
        held.check()  # renewed in time so far
    finally:
        held.release()
    assert repo.intents() == []

    # a holder whose heartbeat stopped (hung) past its time to live
    monkeypatch.setenv("CHECKPOINT_OPS_LEASE_TTL", "1")
    hung = HeldClaim(repo.fm, repo.root, INTENT, "20260101T000000.000000Z-0000beef.json", "test").acquire()
    hung._heartbeat.stop()
    wait_for(lambda: not repo.intents()[0].live, "the hung holder's intent to be judged stale")
    with pytest.raises(Exception, match="without renewal"):
        hung.check()
    hung.release()

    # a holder whose renewal fails (its record's place taken by a directory)
    failing = HeldClaim(repo.fm, repo.root, INTENT, "20260101T000000.000000Z-0000f00d.json", "test").acquire()
    os.remove(failing.path)
    os.mkdir(failing.path)
    wait_for(lambda: failing._heartbeat.error is not None, "the renewal to fail")
    with pytest.raises(Exception, match="could not be renewed"):
        failing.check()
    failing._heartbeat.stop()
    os.rmdir(failing.path)


def test_releasing_a_claim_does_not_wait_for_a_renewal_hung_on_the_store(faulty_s3, s3_server, bucket):
    """A backup intent's renewal PUT held up 8 s by the store (ttl 3 s: a renewal every second). Release
    waits for it at most one renewal interval and deletes the record; the late renewal, an unconditional
    write, lands after that and writes the record back, and the release deletes it again once the renewal
    has returned: no intent is left holding garbage collection. (Before, release joined the renewal for as
    long as the store took.)"""
    from tests.faulty_s3 import FaultPlan

    repo = Repository.open(f"s3://{bucket}/dest", {"endpoint_url": faulty_s3.endpoint}, create=True)
    held = HeldClaim(repo.fm, repo.root, INTENT, "20260101T000000.000000Z-0000abcd.json", "test", ttl_s=3).acquire()
    beat = held._heartbeat
    key = f"dest/{held.rel}"
    s3 = boto3.client("s3", endpoint_url=s3_server)

    def stored() -> bool:
        return s3.list_objects_v2(Bucket=bucket, Prefix=key).get("KeyCount", 0) > 0

    try:
        faulty_s3.set_plan(FaultPlan(rate=1.0, faults=("slow",), requests=frozenset({"PUT"}), delay_s=8))
        wait_for(lambda: faulty_s3.stats.faults[("PUT", "slow")], "a renewal held up at the store")
        started = time.monotonic()
        held.release()
        took = time.monotonic() - started
        assert took < 5, f"release waited {took:.1f} s for a renewal hung on the store"
        assert not stored()
        wait_for(lambda: stored() or not beat._thread.is_alive(), "the late renewal to land")
        beat._thread.join(30)
        assert not beat._thread.is_alive()
        wait_for(lambda: not stored(), "the record the late renewal wrote back to be deleted again")
    finally:
        faulty_s3.calm()



def test_releasing_a_claim_quietly_on_a_store_that_keeps_failing_leaves_it_to_go_stale(faulty_s3, bucket):
    """The store down through every retry of the delete: ``release_quietly`` (a restore's intent on its way out,
    after the restore's own outcome) raises nothing, and the record is left to go stale; ``release`` raises the
    store's error. Before, the quiet release let our own ``StoreUnavailableError`` through: a restore stopped
    part-way (journaled, its fix naming ``resume``) ended instead with the release's "nothing was changed; run the
    same command again", which is refused there (seen in ``make reliability``)."""
    from checkpoint_ops.errors import StoreUnavailableError

    repo = Repository.open(f"s3://{bucket}/dest", {"endpoint_url": faulty_s3.endpoint}, create=True)
    names = iter(["20260101T000000.000000Z-0000abcd.json", "20260101T000000.000000Z-0000abce.json"])
    quiet, loud = (HeldClaim(repo.fm, repo.root, INTENT, next(names), "test", ttl_s=30).acquire() for _ in range(2))
    try:
        faulty_s3.outage(60)
        quiet.release_quietly()
        with pytest.raises(StoreUnavailableError):
            loud.release()
    finally:
        faulty_s3.calm()
    assert all(repo.fm.exists(repo.path(claim.rel)) for claim in (quiet, loud))  # both left to go stale

# ---- leftovers on S3: an unfinished multipart upload -------------------------------------------------------


@HDFS
def test_an_upload_killed_mid_way_is_aborted_by_prune(run, s3_server, bucket, runner):
    dest = Dest(f"s3://{bucket}/backups", endpoint=s3_server, bucket=bucket)
    backup(run, dest.url)
    big = os.path.join(run.checkpoint, "big-notes.bin")  # anything at the top is taken; this one is multipart
    with open(big, "wb") as f:
        for i in range(9):
            f.write(os.urandom(8 * 2**20))
    # its intent (1), the object's publish (2), then one call per chunk sent: the upload starts when a
    # part's worth is buffered, so the kill lands after that with the upload open
    part = math.ceil(s3fs.S3FileSystem.default_block_size / direct_put._PART_BYTES)
    intent = killed_backup(runner, run, dest, kill_at=2 + part + 1)
    assert [u.rsplit("/", 1)[-1] for u in dest.uploads()], "the killed backup left its upload open"
    (upload,) = dest.uploads()

    repo = Repository.open(dest.url)
    held = repo.hold_intent("20990101T000000.000000Z-0000abcd", "elsewhere")  # a backup running now
    try:
        r = prune(dest, "--temp-min-age", "0s", "--yes")
        assert r["plan"]["summary"]["leftovers"] == "1 left alone while a backup is being taken"
        assert dest.uploads() == [upload] and r["result"]["claims_removed"] == 1
    finally:
        held.release()
    dry = prune(dest, "--temp-min-age", "0s", "--dry-run")["plan"]
    (action,) = [a for a in dry["actions"] if "#upload=" in a["rel"]]
    assert action["rel"].startswith(upload + "#upload=") and "multipart upload" in action["reason"]
    r = prune(dest, "--temp-min-age", "0s", "--yes")["result"]
    assert r["leftovers_removed"] == 1 and dest.uploads() == [] and intent["rel"] not in dest.files()
    # and the file is backed up whole by the next backup
    b = backup(run, dest.url)
    assert b["new_objects"] == 1 and cli_json("backup", "verify", dest.url)[0] == 0


# ---- damaged manifests -------------------------------------------------------------------------------------


@HDFS
def test_a_damaged_manifest_leaves_every_other_backup_usable(spark, run, dest, tmp_path):
    b1 = backup(run, dest.url)
    files = run.files + 2
    write_event_files(run.input, run.files, files)  # more batches: Spark's cleanup makes some of b1's
    run.run_query(spark)  # objects its alone
    b2 = backup(run, dest.url)
    assert cli_json("backup", "verify", dest.url)[0] == 0
    repo = Repository.open(dest.url)
    only_b1 = {f"objects/{h[:2]}/{h}" for h in
               repo.manifest(b1["backup_id"]).hashes() - repo.manifest(b2["backup_id"]).hashes()}
    assert only_b1
    rel = f"manifests/{b2['backup_id']}.json"
    doc = json.loads(dest.read(rel))
    doc["roots"]["checkpoint"]["files"][0][0] = "../../escape"
    dest.write(rel, json.dumps(doc).encode())

    code, listed = cli_json("backup", "list", dest.url)
    assert code == 0
    good, bad = listed["backups"]
    assert (good["id"], good["status"], bad["id"], bad["status"]) == (b1["backup_id"], "verified",
                                                                      b2["backup_id"], "damaged")
    # its last verification passed, but it is no longer what was verified
    assert "'../../escape'" in bad["damaged"] and bad["verified"] == "FAILED" and bad["manifest"].endswith(rel)

    code, v = cli_json("backup", "verify", dest.url)  # the others are verified; the damaged one is named
    assert code == 1 and [b["backup_id"] for b in v["backups"]] == [b1["backup_id"]] and v["backups"][0]["ok"]
    assert v["damaged"][0]["id"] == b2["backup_id"] and "'../../escape'" in v["damaged"][0]["problem"]
    before = dest.snapshot()
    for args in (("backup", "verify", dest.url, b2["backup_id"]),
                 ("backup", "restore", dest.url, b2["backup_id"], tmp_path / "t" / "ckpt", "--sink-target",
                  tmp_path / "t" / "out", "--yes")):
        code, out, err = cli(*args)
        assert code == 2 and rel in err and "would leave its root" in err and "Traceback" not in err, (args, err)
    assert dest.snapshot() == before and not (tmp_path / "t").exists()

    b3 = backup(run, dest.url)  # new backups proceed, incremental to the newest usable one
    assert b3["parent"] == b1["backup_id"]
    assert cli_json("backup", "verify", dest.url, b3["backup_id"])[0] == 0
    r = prune(dest, "--yes")  # b3 is the newest and the newest verified: b1 goes, but its objects wait
    assert r["plan"]["summary"]["delete"] == [b1["backup_id"]]
    objects = r["plan"]["summary"]["objects"]
    assert objects.startswith("blocked: 1 damaged manifest(s)") and rel in objects
    assert not [a for a in r["plan"]["actions"] if a["rel"].startswith("objects/")]
    assert r["result"]["objects_deferred"] is True and rel in r["result"]["note"]
    assert rel in dest.files() and only_b1 <= dest.objects()

    restore_and_resume(spark, run, dest, b3["backup_id"], tmp_path, files)

    dest.remove(rel)  # the user removes it: collection runs again
    r = prune(dest, "--yes")
    assert only_b1 <= {a["rel"] for a in r["plan"]["actions"]}
    assert (r["result"]["objects_deferred"], r["result"]["objects_deleted"]) == (False, len(only_b1))
    assert not only_b1 & dest.objects() and cli_json("backup", "verify", dest.url)[0] == 0


# ---- what list says about verification ------------------------------------------------------------------


@HDFS
def test_list_shows_the_outcome_of_the_last_verification(run, tmp_path):
    dest = str(tmp_path / "dest")
    b = backup(run, dest)
    row = cli_json("backup", "list", dest)[1]["backups"][0]
    assert (row["status"], row["verified"], row["last_verification"]) == ("unverified", None, None)
    assert cli_json("backup", "verify", dest)[0] == 0
    row = cli_json("backup", "list", dest)[1]["backups"][0]
    assert row["status"] == "verified" and row["verified"] == row["last_verification"]["at"]
    assert row["last_verification"]["bad_objects"] == 0

    repo = Repository.open(dest)
    shas = sorted({f[1] for f in repo.manifest(b["backup_id"]).roots["checkpoint"]["files"]})
    damaged, unreadable = repo.object_path(shas[0]), repo.object_path(shas[1])
    saved = {p: open(p, "rb").read() for p in (damaged, unreadable)}
    with open(damaged, "r+b") as f:
        f.write(b"\x00garbage")
    os.remove(unreadable)
    os.mkdir(unreadable)  # a read of it fails (not "missing"): still a failed verification, recorded
    code, out, err = cli("backup", "verify", dest)
    assert code == 1 and "Traceback" not in err
    row = cli_json("backup", "list", dest)[1]["backups"][0]
    v = row["last_verification"]
    assert (row["status"], row["verified"], v["ok"], v["bad_objects"]) == ("failed", "FAILED", False, 2)
    assert any(sha in v["first_problem"] for sha in shas[:2]), v
    assert "does not match its hash" in v["first_problem"] or "cannot be read" in v["first_problem"]
    code, out, err = cli("backup", "list", dest)
    assert "FAILED at" in out and "2 bad object(s)" in out

    os.rmdir(unreadable)
    for p, data in saved.items():
        with open(p, "wb") as f:
            f.write(data)
    assert cli_json("backup", "verify", dest)[0] == 0
    assert cli_json("backup", "list", dest)[1]["backups"][0]["status"] == "verified"


@HDFS
def test_list_says_failed_for_a_backup_holding_an_object_another_verification_found_bad(run, tmp_path):
    """Two backups share an object; a verification of the second finds it damaged. Before, the first still
    listed as verified (its own last verification passed) though its restore is refused for that object."""
    dest = str(tmp_path / "dest")
    first, second = backup(run, dest), backup(run, dest)  # the second references the first's objects
    assert cli_json("backup", "verify", dest)[0] == 0
    repo = Repository.open(dest)
    shared = sorted(repo.manifest(first["backup_id"]).hashes() & repo.manifest(second["backup_id"]).hashes())
    path = repo.object_path(shared[0])
    saved = open(path, "rb").read()
    with open(path, "r+b") as f:
        f.write(b"\x00garbage")
    assert cli("backup", "verify", dest, second["backup_id"])[0] == 1
    row = {r["id"]: r for r in cli_json("backup", "list", dest)[1]["backups"]}[first["backup_id"]]
    assert row["last_verification"]["ok"] is True  # its own, before the damage
    assert (row["status"], row["verified"], row["known_bad_objects"]) == ("failed", "FAILED", 1), row
    code, out, _ = cli("backup", "list", dest)
    assert "FAILED: 1 of its objects marked bad by a verification since its own (which passed at" in out, out

    with open(path, "wb") as f:
        f.write(saved)
    assert cli_json("backup", "verify", dest)[0] == 0  # found whole: no longer marked
    rows = cli_json("backup", "list", dest)[1]["backups"]
    assert [(r["status"], r["known_bad_objects"]) for r in rows] == [("verified", 0), ("verified", 0)]


def test_a_verification_during_a_prune_reports_no_object_of_a_backup_the_prune_deleted(tmp_path):
    """A verification lists the backups, then reads their objects; a prune meanwhile deletes a backup's manifest and
    then the objects no other backup names. Those were reported missing (exit 1 on a healthy destination, a hostile
    review: the Dagster backup job and a scheduled verify raise false alarms), marked bad, and recorded as a failed
    verification of a backup that no longer exists. Now the backup is named as pruned meanwhile, not verified; the
    others are verified as usual. The repository below listed its backups before the prune, as a verification does
    first. Synthetic checkpoint: no Spark needed."""
    from benchmarks import synthetic
    from checkpoint_ops.backup import verify_backups

    ckpt, dest = str(tmp_path / "q" / "checkpoint"), str(tmp_path / "dest")
    synthetic.write_local(ckpt, batches=30, partitions=2, retain_state=10)
    code, older = cli_json("backup", "create", ckpt, dest)
    assert code == 0, older
    assert cli("rollback", ckpt, "--to-batch", "25", "--yes")[0] == 0  # batches 26..29 only in the first backup
    code, newer = cli_json("backup", "create", ckpt, dest)
    assert code == 0, newer
    repo = Repository.open(dest)
    listed = [m.id for m in repo.manifests()]  # the verification's listing, before the prune
    assert listed == [older["backup_id"], newer["backup_id"]]
    only_older = repo.manifest(older["backup_id"]).hashes() - repo.manifest(newer["backup_id"]).hashes()
    assert only_older
    code, pruned = cli_json("backup", "prune", dest, "--keep-last", "1", "--yes")
    assert code == 0 and pruned["result"]["objects_deleted"] >= len(only_older), pruned

    report = verify_backups(repo)
    assert report["ok"] and report["bad_objects"] == [], report["bad_objects"][:3]
    assert report["pruned_meanwhile"] == [older["backup_id"]], report
    assert [b["backup_id"] for b in report["backups"]] == [newer["backup_id"]] and report["backups"][0]["ok"]
    assert not os.path.exists(os.path.join(dest, "bad")) or not os.listdir(os.path.join(dest, "bad"))
    assert sorted(os.listdir(os.path.join(dest, "verified"))) == [f"{newer['backup_id']}.json"]
    rows = cli_json("backup", "list", dest)[1]["backups"]
    assert [(r["id"], r["status"]) for r in rows] == [(newer["backup_id"], "verified")], rows

    # the backup asked for by id, gone meanwhile: not verified (exit 1 from the CLI), nothing recorded for it
    report = verify_backups(repo, older["backup_id"])
    assert not report["ok"] and report["pruned_meanwhile"] == [older["backup_id"]] and report["backups"] == [], report
    assert report["objects_checked"] == len(repo.manifest(older["backup_id"]).hashes()), report  # what was read
    assert sorted(os.listdir(os.path.join(dest, "verified"))) == [f"{newer['backup_id']}.json"]


def test_a_restore_refused_for_a_bad_object_names_the_newest_backup_without_it(tmp_path):
    """A restore refused for a damaged object said only "restore another backup". It now marks the object bad
    (``backup list`` shows it), and names the newest other backup of the same checkpoint and query that holds no
    bad object, with its batch against this one's and whether it was verified; or says there is none (a backup
    of another query at the same path is never offered). Synthetic checkpoint: no Spark needed."""
    from benchmarks import synthetic

    ckpt, dest = str(tmp_path / "q" / "checkpoint"), str(tmp_path / "dest")
    synthetic.write_local(ckpt, batches=30, partitions=2, retain_state=10)
    code, older = cli_json("backup", "create", ckpt, dest)
    assert code == 0, older
    synthetic.write_local(ckpt, batches=31, partitions=2, retain_state=10)  # one more batch: new objects
    code, newer = cli_json("backup", "create", ckpt, dest)
    assert code == 0, newer
    repo = Repository.open(dest)
    hashes = {b["backup_id"]: repo.manifest(b["backup_id"]).hashes() for b in (older, newer)}
    only_newer = sorted(hashes[newer["backup_id"]] - hashes[older["backup_id"]])
    shared = sorted(hashes[newer["backup_id"]] & hashes[older["backup_id"]])

    saved = {}

    def damage(sha):
        saved[sha] = open(repo.object_path(sha), "rb").read()
        with open(repo.object_path(sha), "r+b") as f:
            f.write(b"\x00garbage")

    damage(only_newer[0])
    code, _, err = cli("backup", "restore", dest, newer["backup_id"], tmp_path / "r1", "--yes")
    assert code == 2 and "nothing was restored" in err, err
    assert f"restore backup {older['backup_id']} instead" in err, err
    assert "batch 29, earlier than this backup's 30" in err and "not verified: run `checkpoint-ops backup verify" in err
    rows = {r["id"]: r["status"] for r in cli_json("backup", "list", dest)[1]["backups"]}
    assert rows == {older["backup_id"]: "unverified", newer["backup_id"]: "failed"}, rows  # marked by the restore
    damage(shared[0])
    code, _, err = cli("backup", "restore", dest, newer["backup_id"], tmp_path / "r2", "--yes")
    assert code == 2 and f"no other backup of {ckpt} (query " in err and "is free of them" in err, err
    assert not (tmp_path / "r1").exists() or not any((tmp_path / "r1").iterdir())

    for sha, data in saved.items():  # repaired; a verification finds them whole and clears their marks
        with open(repo.object_path(sha), "wb") as f:
            f.write(data)
    assert cli_json("backup", "verify", dest)[0] == 0
    # the checkpoint deleted and a new query started at the same path: its backup is never offered the old ones
    with open(os.path.join(ckpt, "metadata"), "w") as f:
        f.write('{"id":"00000000-0000-4000-8000-000000000001"}')
    code, other = cli_json("backup", "create", ckpt, dest)
    assert code == 0, other
    fresh = sorted(Repository.open(dest).manifest(other["backup_id"]).hashes() - hashes[newer["backup_id"]]
                   - hashes[older["backup_id"]])
    damage(fresh[0])
    code, _, err = cli("backup", "restore", dest, other["backup_id"], tmp_path / "r3", "--yes")
    assert code == 2 and "no other backup of" in err and "00000000-0000-4000-8000-000000000001" in err, err


@HDFS
def test_a_destination_inside_or_around_what_it_backs_up_is_refused_before_anything_is_written(run, tmp_path):
    """A destination inside the checkpoint or a file sink (or the same place, or around one) used to be accepted
    (review H): each backup then copied the earlier ones into itself, growing every time, and a restore put them
    inside the restored checkpoint. Now exit 2, naming both places, before anything is read or written."""
    from tests.helpers import tree_snapshot

    parent = os.path.dirname(run.checkpoint)
    before = tree_snapshot(parent)
    link = str(tmp_path / "link")
    os.symlink(run.checkpoint, link)
    for dest, how, what in [(os.path.join(run.checkpoint, "bk"), "lies inside", "checkpoint"),
                            (os.path.join(link, "bk"), "lies inside", "checkpoint"),  # another spelling of it
                            (os.path.join(run.output, "bk"), "lies inside", "file sink"),
                            (run.output, "is the same place as", "file sink"),
                            (parent, "contains", "checkpoint")]:
        code, doc = cli_json("backup", "create", run.checkpoint, dest, "--sink", run.output, *INTERVALS)
        assert code == 2, (dest, doc)
        assert f"the backup destination {dest} {how} the {what}" in doc["problem"], doc
        assert "outside the checkpoint and its file sinks" in doc["fix"], doc
        assert tree_snapshot(parent) == before, dest


def test_places_overlap_by_place_on_object_stores_too():
    from checkpoint_ops.storage.paths import how_places_overlap

    assert how_places_overlap("s3://b/ckpt/bk", "s3a://b/ckpt") == "lies inside"
    assert how_places_overlap("s3://b/ckpt/", "s3://b/ckpt") == "is the same place as"
    assert how_places_overlap("s3://b", "s3://b/ckpt") == "contains"
    assert how_places_overlap("s3://b/ckpt-backups", "s3://b/ckpt") is None
    assert how_places_overlap("s3://other/ckpt/bk", "s3://b/ckpt") is None


def test_a_destination_that_is_a_file_is_named_as_such(tmp_path):
    """A regular file as the destination was "storage error: [Errno 20] Not a directory", with a fix about
    credentials and a backup stopped part-way (review H)."""
    from checkpoint_ops.errors import BadInputError

    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(BadInputError) as refused:
        Repository.locate(str(afile))
    assert refused.value.path == str(afile) and "not a directory (a file is there)" in refused.value.problem
    assert afile.read_text() == "x"
