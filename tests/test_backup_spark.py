"""Backups with real Spark: back up to the S3 server, run more batches, back up again (only new content
is uploaded), restore the first backup into a new place with the input and output relocated, and Spark
resumes there with exactly the output of an uninterrupted run. Also: a backup taken while the query
runs, a corrupted object, pruning, restoring to an earlier batch, a DStream checkpoint, bad input.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time

import boto3
import pytest

from checkpoint_ops.backup import Repository
from checkpoint_ops.backup.restore import RestoreOperation
from checkpoint_ops.operation import RunOptions
from checkpoint_ops.operation import run as run_operation
from checkpoint_ops.recovery import ResumeOperation
from pipelines.event_counts import build_query, expected_windows, flush_files, read_output, write_event_files
from tests.crash import NEVER, ForkRunner
from tests.helpers import cli, cli_json, tree_snapshot
from tests.spark_runs import FLAVOURS, SESSION_CONF, unload_state_stores
from tests.test_rollback_spark import INTERVALS
from tests.test_spark_formats import dstream_checkpoint  # noqa: F401  (a fixture)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def objects(endpoint: str, bucket: str, prefix: str = "backups/objects/") -> dict[str, int]:
    s3, out, token = boto3.client("s3", endpoint_url=endpoint), {}, None
    while True:
        kw = {"Bucket": bucket, "Prefix": prefix, **({"ContinuationToken": token} if token else {})}
        resp = s3.list_objects_v2(**kw)
        out.update({o["Key"]: o["Size"] for o in resp.get("Contents", [])})
        if not resp.get("IsTruncated"):
            return out
        token = resp["NextContinuationToken"]


def backup(run, dest, *extra):
    code, r = cli_json("backup", "create", run.checkpoint, dest, "--sink", run.output, *INTERVALS, *extra)
    assert code == 0, r
    return r


def resume_at(spark, flavour: str, inp: str, out: str, ckpt: str) -> None:
    """Run the example query (availableNow) on these directories, with the flavour's confs."""
    for k, v in {**SESSION_CONF, **FLAVOURS[flavour]}.items():
        if k.startswith("spark.sql."):
            spark.conf.set(k, v)
    q = build_query(spark, inp, out, ckpt)
    q.awaitTermination()
    unload_state_stores(spark)


def exact(files: int) -> dict:
    return {k: [v] for k, v in expected_windows(range(files)).items()}


def restore_elsewhere(run, dest: str, backup_id: str, where, *extra) -> tuple[str, str, str]:
    """Restore into new directories, the input copied there (as a user would) and relocated."""
    inp, out, ckpt = str(where / "in"), str(where / "out"), str(where / "ckpt")
    shutil.copytree(run.input, inp)
    code, r = cli_json("backup", "restore", dest, backup_id, ckpt, "--sink-target", out,
                       "--relocate", f"{run.input}={inp}", *extra, "--yes")
    assert code == 0, r
    return inp, out, ckpt


def test_incremental_backup_to_s3_and_restore_elsewhere(spark, run, bucket, s3_server, tmp_path):
    dest = f"s3://{bucket}/backups"
    b1 = backup(run, dest)
    before = objects(s3_server, bucket)
    assert b1["new_objects"] == len(before) and b1["new_bytes"] == sum(before.values())
    m1 = json.loads(boto3.client("s3", endpoint_url=s3_server).get_object(
        Bucket=bucket, Key=f"backups/manifests/{b1['backup_id']}.json")["Body"].read())

    files = run.files + 4  # more input: four more batches
    write_event_files(run.input, run.files, files)
    run.run_query(spark)
    b2 = backup(run, dest)
    after = objects(s3_server, bucket)
    new = {k: s for k, s in after.items() if k not in before}
    # only new content was uploaded: what the objects are, counted at the server
    assert b2["new_objects"] == len(new) > 0 and b2["new_bytes"] == sum(new.values())
    m2 = json.loads(boto3.client("s3", endpoint_url=s3_server).get_object(
        Bucket=bucket, Key=f"backups/manifests/{b2['backup_id']}.json")["Body"].read())
    h1 = {f[1] for r in m1["roots"].values() for f in r["files"]}
    h2 = {f[1] for r in m2["roots"].values() for f in r["files"]}
    assert {k.rsplit("/", 1)[-1] for k in new} == h2 - h1
    # and files that did not change were not read again
    assert b2["read_files"] < b2["files"] and b2["parent"] == b1["backup_id"]

    # the FIRST backup, restored into a new place with input and output relocated: Spark resumes there
    inp, out, ckpt = restore_elsewhere(run, dest, b1["backup_id"], tmp_path)
    code, f = cli_json("fsck", ckpt, "--sink", out, *INTERVALS)
    assert (code, f["findings"]) == (0, [])
    flush_files(inp, files)
    resume_at(spark, run.flavour, inp, out, ckpt)
    assert read_output(spark, out) == exact(files)


@pytest.mark.parametrize("flavour", ["rocksdb_v2"])
def test_restore_to_an_earlier_batch(spark, run, tmp_path):
    dest = str(tmp_path / "dest")
    b = backup(run, dest)
    m = b["batch"] - 3
    inp, out, ckpt = restore_elsewhere(run, dest, b["backup_id"], tmp_path, "--to-batch", m)
    code, i = cli_json("inspect", ckpt, "--sink", out, *INTERVALS)
    assert i["last_committed_batch"] == m
    flush_files(inp, run.files)
    resume_at(spark, run.flavour, inp, out, ckpt)
    assert read_output(spark, out) == exact(run.files)


@pytest.mark.parametrize("flavour", ["rocksdb"])
def test_backup_while_the_query_runs(spark, run, tmp_path):
    """Backups taken while Spark commits batches (and its maintenance snapshots and deletes state
    files): the last one restores into a new place and resumes exactly."""
    dest = str(tmp_path / "dest")
    for k, v in {**SESSION_CONF, **FLAVOURS[run.flavour]}.items():
        if k.startswith("spark.sql."):
            spark.conf.set(k, v)
    q = build_query(spark, run.input, run.output, run.checkpoint, available_now=False)
    files, taken = run.files, []
    try:
        for _ in range(4):
            write_event_files(run.input, files, files + 2)
            files += 2
            time.sleep(1.5)
            code, r = cli_json("backup", "create", run.checkpoint, dest, "--sink", run.output, *INTERVALS)
            assert code == 0, r
            taken.append(r)
    finally:
        q.stop()
        unload_state_stores(spark)
    assert len({r["batch"] for r in taken}) > 1, "the query should have committed batches during the backups"
    inp, out, ckpt = restore_elsewhere(run, dest, taken[-1]["backup_id"], tmp_path)
    flush_files(inp, files)
    resume_at(spark, run.flavour, inp, out, ckpt)
    assert read_output(spark, out) == exact(files)


@pytest.mark.parametrize("flavour", ["hdfs"])
def test_a_corrupt_object_is_named_and_nothing_is_restored(run, tmp_path):
    dest = str(tmp_path / "dest")
    b = backup(run, dest)
    repo = Repository.open(dest)
    sha = next(f[1] for f in repo.manifest(b["backup_id"]).roots["checkpoint"]["files"] if f[0].startswith("state/"))
    with open(repo.object_path(sha), "r+b") as f:
        f.write(b"\x00\x01garbage")
    code, out, err = cli("backup", "verify", dest)
    assert code == 1 and sha in out and "Traceback" not in err
    target = tmp_path / "restored"
    code, out, err = cli("backup", "restore", dest, b["backup_id"], target / "ckpt", "--sink-target", target / "out",
                         "--yes")
    assert code == 2 and sha in err and "nothing was restored" in err
    assert not any(os.scandir(target)) if target.exists() else True
    code, v = cli_json("backup", "list", dest)
    assert v["backups"][0]["verified"] == "FAILED"


@pytest.mark.parametrize("flavour", ["hdfs"])
def test_prune_keeps_the_newest_verified_and_never_breaks_another(spark, run, tmp_path):
    dest = str(tmp_path / "dest")
    ids, files = [], run.files
    for i in range(3):
        if i:
            write_event_files(run.input, files, files + 2)
            files += 2
            run.run_query(spark)
        ids.append(backup(run, dest)["backup_id"])
    assert cli_json("backup", "verify", dest, ids[1])[0] == 0  # only the second is verified
    code, dry = cli_json("backup", "prune", dest, "--keep-last", "1", "--dry-run")
    assert code == 0 and dry["plan"]["summary"]["delete"] == [ids[0]]
    assert dry["plan"]["summary"]["keep"] == {ids[1]: "newest verified", ids[2]: "among the newest 1"}
    code, r = cli_json("backup", "prune", dest, "--keep-last", "1", "--yes")
    assert code == 0 and r["result"]["manifests_deleted"] == 1 and r["result"]["objects_deleted"] > 0
    code, v = cli_json("backup", "verify", dest)
    assert code == 0 and v["ok"] and {b["backup_id"] for b in v["backups"]} == set(ids[1:])
    # a backup that died mid-way (killed at its 2nd mutating call: its intent comes first; nothing changed
    # since the last backup, so the 2nd is its manifest) no longer holds garbage collection: its process
    # is gone, so the prune says so, removes its intent and collects
    env = dict(os.environ, CHECKPOINT_OPS_KILL_AT="2")
    p = subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", "backup", "create", run.checkpoint, dest, "--sink",
                        run.output, *INTERVALS, "--json"], env=env, cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == -9, p.stderr[-2000:]
    assert len(Repository.open(dest).manifests()) == 2 and os.listdir(os.path.join(dest, "intents"))
    code, r = cli_json("backup", "prune", dest, "--keep-last", "1", "--yes")  # the third is the newest verified now
    assert code == 0 and r["plan"]["summary"]["delete"] == [ids[1]], r
    assert r["result"]["objects_deferred"] is False and r["result"]["claims_removed"] == 1
    assert r["result"]["objects_deleted"] > 0 and "is gone" in r["plan"]["summary"]["stale claims"][0]
    assert not os.listdir(os.path.join(dest, "intents"))
    code, v = cli_json("backup", "verify", dest)
    assert code == 0 and [b["backup_id"] for b in v["backups"]] == [ids[2]]
    inp, out, ckpt = restore_elsewhere(run, dest, ids[2], tmp_path)
    assert cli_json("fsck", ckpt, "--sink", out, *INTERVALS)[0] == 0


@pytest.mark.parametrize("flavour", ["hdfs"])
def test_a_prune_while_a_restore_runs_collects_none_of_its_objects(spark, run, tmp_path):
    """A restore holds an intent at the destination from before it reads an object until its apply ends: a prune
    that drops the backup being restored leaves its objects for the next prune (it deleted them, and the restore
    failed part-way with its target fenced and nothing to resume from; hostile review)."""
    dest = str(tmp_path / "dest")
    first = backup(run, dest)["backup_id"]
    write_event_files(run.input, run.files, run.files + 2)
    run.run_query(spark)
    backup(run, dest)
    code, dry = cli_json("backup", "prune", dest, "--keep-last", "1", "--dry-run")
    assert code == 0 and dry["plan"]["summary"]["delete"] == [first] and not dry["plan"]["summary"]["objects"].startswith("0 ")
    target = tmp_path / "t"
    pruned = []
    op = RestoreOperation(dest, first, str(target / "ckpt"), [str(target / "out")])
    result = run_operation(op, RunOptions(yes=True, show_plan=lambda plan: pruned.append(
        cli_json("backup", "prune", dest, "--keep-last", "1", "--yes"))))  # between the restore's plan and apply
    assert result.outcome is not None
    code, r = pruned[0]
    assert code == 0 and r["plan"]["summary"]["delete"] == [first], r
    assert r["result"]["objects_deferred"] is True and r["result"]["objects_deleted"] == 0, r["result"]
    assert f"restore of backup {first}" in r["result"]["note"], r["result"]
    assert cli_json("fsck", str(target / "ckpt"), "--sink", str(target / "out"), *INTERVALS)[0] == 0
    assert not os.listdir(os.path.join(dest, "intents"))  # released
    code, r = cli_json("backup", "prune", dest, "--keep-last", "1", "--yes")  # now the objects go
    assert code == 0 and r["result"]["objects_deleted"] > 0, r


def _killed_restore(run, dest: str, backup_id: str, target, first_journaled: bool = False) -> None:
    """``backup restore`` of ``backup_id`` into ``target`` killed (SIGKILL) half-way through its changes, or
    (``first_journaled``) at the first change after which there is something to resume: every copy still to do."""
    restore = ["backup", "restore", dest, backup_id, target / "ckpt", "--sink-target", target / "out", "--yes"]
    runner = ForkRunner()
    try:
        assert runner.run(*restore, kill_at=NEVER)[0] == 0  # how many changes it makes
        total = runner.mutations
        for k in range(1, total) if first_journaled else [total // 2]:
            shutil.rmtree(target)
            assert runner.run(*restore, kill_at=k)[0] == -9
            if not first_journaled or cli("resume", str(target / "ckpt"), "--dry-run")[0] == 0:
                return
        raise AssertionError("no kill point left a restore to resume")
    finally:
        runner.close()


@pytest.mark.parametrize("flavour", ["hdfs"])
def test_a_resumed_restore_holds_its_intent_and_says_undo_when_its_objects_were_pruned(spark, run, tmp_path):
    """``resume`` of a killed restore takes the restore's intent at the destination again (it held none: a prune
    meanwhile deleted the objects it was copying); where they went while nothing ran, it says so before changing
    anything and names ``undo`` (it said to fix credentials or permissions and resume again; hostile review)."""
    dest = str(tmp_path / "dest")
    first = backup(run, dest)["backup_id"]
    write_event_files(run.input, run.files, run.files + 2)
    run.run_query(spark)
    backup(run, dest)
    target = tmp_path / "t"
    _killed_restore(run, dest, first, target)
    # a prune while the resume runs (between its plan and its apply) leaves the objects for the next prune
    pruned = []
    op = ResumeOperation(str(target / "ckpt"))
    result = run_operation(op, RunOptions(yes=True, show_plan=lambda plan: pruned.append(
        cli_json("backup", "prune", dest, "--keep-last", "1", "--yes"))))
    assert result.outcome is not None and result.outcome.status == "applied"
    code, r = pruned[0]
    assert code == 0 and r["plan"]["summary"]["delete"] == [first], r
    assert r["result"]["objects_deferred"] is True and r["result"]["objects_deleted"] == 0, r["result"]
    assert not os.listdir(os.path.join(dest, "intents"))  # released
    assert cli_json("fsck", str(target / "ckpt"), "--sink", str(target / "out"), *INTERVALS)[0] == 0

    # the objects gone while nothing ran (deleted, or collected by a prune that found the intent stale): the
    # resume names undo, and changes nothing
    first = backup(run, dest)["backup_id"]
    target = tmp_path / "t2"
    _killed_restore(run, dest, first, target, first_journaled=True)
    shutil.rmtree(os.path.join(dest, "objects"))
    before = tree_snapshot(str(target))
    intents = set(os.listdir(os.path.join(dest, "intents")))  # the killed restores' own: stale
    code, out, err = cli("resume", str(target / "ckpt"), "--dry-run")  # the dry run says so too
    assert code == 2 and f"checkpoint-ops undo {target / 'ckpt'}" in err, (out, err)
    code, out, err = cli("resume", str(target / "ckpt"))
    assert code == 2, (out, err)
    assert f"backup {first}" in err and "pruned" in err and f"checkpoint-ops undo {target / 'ckpt'}" in err, err
    assert "credentials" not in err, err
    assert tree_snapshot(str(target)) == before  # nothing changed
    assert set(os.listdir(os.path.join(dest, "intents"))) == intents  # its own intent released
    code, out, err = cli("undo", str(target / "ckpt"), "--yes")
    assert code == 0, (out, err)


@pytest.mark.parametrize("flavour", ["hdfs"])
def test_a_backup_waits_for_a_running_garbage_collection(run, tmp_path):
    dest = str(tmp_path / "dest")
    backup(run, dest)
    repo = Repository.open(dest)
    lock = repo.take_prune_lock()
    done = []
    t = threading.Thread(target=lambda: done.append(backup(run, dest)))
    t.start()
    time.sleep(2)
    assert not done, "the backup must wait while a prune holds its lock"
    repo.release_prune_lock(lock)
    t.join(30)
    assert done and cli_json("backup", "verify", dest)[0] == 0


def test_dstream_checkpoint_backs_up_and_restores_identically(dstream_checkpoint, tmp_path):
    dest = str(tmp_path / "dest")
    code, r = cli_json("backup", "create", dstream_checkpoint, dest)
    assert code == 0 and r["kind"] == "dstream", r
    target = str(tmp_path / "restored")
    code, rr = cli_json("backup", "restore", dest, r["backup_id"], target, "--yes")
    assert code == 0, rr

    def files(root):
        return {p[len(str(root)) + 1:]: d for p, (d, _) in tree_snapshot(str(root)).items()
                if not os.path.basename(p).startswith(".") and os.path.basename(p) != "temp"}

    assert files(target) == files(dstream_checkpoint) and files(target)


@pytest.mark.parametrize("flavour", ["hdfs"])
def test_bad_backup_input_is_refused_and_changes_nothing(run, tmp_path):
    dest = str(tmp_path / "dest")
    b = backup(run, dest)
    target = tmp_path / "t"

    def refused(*args, says: str, code: int = 2):
        roots = [r for r in (dest, str(tmp_path / "foreign"), str(target)) if os.path.exists(r)]
        before = tree_snapshot(*roots)
        c, out, err = cli(*map(str, args))
        assert c == code and says in err and "Traceback" not in err, (args, c, out, err)
        assert tree_snapshot(*roots) == before and (not target.exists() or str(target) in roots), "it changed something"

    refused("backup", "list", tmp_path / "missing", says="no backups here")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    refused("backup", "list", tmp_path / "foreign", says="not a backup destination")
    refused("backup", "create", run.checkpoint, tmp_path / "foreign", "--sink", run.output,
            says="not a backup destination")
    refused("backup", "verify", dest, "nope", says="no backup 'nope'")
    refused("backup", "restore", dest, "nope", target, says="no backup 'nope'")
    # a relocation that sends sink files out of the sink target
    refused("backup", "restore", dest, b["backup_id"], target / "ckpt", "--sink-target", target / "out",
            "--relocate", f"{run.output}=/elsewhere", "--yes", says="outside the sink target")
    refused("backup", "restore", dest, b["backup_id"], target / "ckpt", "--sink-target", target / "out",
            "--relocate", "relative=/x", "--yes", says="not an absolute path")
    # a relocation whose OLD is not where the backup's paths are (a typing slip): the logs would keep the old paths
    for extra in ((), ("--dry-run",)):
        refused("backup", "restore", dest, b["backup_id"], target / "ckpt", "--sink-target", target / "out",
                "--relocate", f"{run.input}-typo={tmp_path / 'in'}", "--yes", *extra,
                says=f"--relocate '{run.input}-typo={tmp_path / 'in'}' matches no path")
    c, out, err = cli("backup", "restore", dest, b["backup_id"], target / "ckpt", "--sink-target", target / "out",
                      "--relocate", f"{run.input}-typo={tmp_path / 'in'}", "--yes")
    assert f"paths outside the checkpoint and its sinks are under: {run.input}" in err, err
    # a non-empty target
    (target / "ckpt").mkdir(parents=True)
    (target / "ckpt" / "keep-me").write_text("x")
    refused("backup", "restore", dest, b["backup_id"], target / "ckpt", "--sink-target", target / "out", "--yes",
            says="not empty: it holds keep-me")
    shutil.rmtree(target)
    # a manifest naming ../ or an absolute path
    for bad in ("../escape", "/etc/passwd"):
        manifest = os.path.join(dest, "manifests", f"{b['backup_id']}.json")
        doc = json.load(open(manifest))
        doc["roots"]["checkpoint"]["files"][0][0] = bad
        open(manifest, "w").write(json.dumps(doc))
        refused("backup", "restore", dest, b["backup_id"], target / "ckpt", "--sink-target", target / "out", "--yes",
                says=f"{bad!r}")


@pytest.mark.parametrize("flavour", ["hdfs"])
def test_relocated_into_a_path_with_a_space_and_non_ascii_letters(spark, run, tmp_path):
    """Relocated paths are written as Spark writes them (``Path.toUri``: a space as ``%20``, ``é`` as it is),
    so the file source knows the files it read before: encoded as ``%C3%A9``, they named other files to
    Spark, which read the batches before the restore point again (rows counted twice)."""
    dest = str(tmp_path / "dest")
    b = backup(run, dest)
    m = b["batch"] - 3
    inp, out, ckpt = restore_elsewhere(run, dest, b["backup_id"], tmp_path / "neu é dir", "--to-batch", m)
    log = os.path.join(ckpt, "sources", "0")
    entries = "".join(open(os.path.join(log, n), encoding="utf-8").read() for n in os.listdir(log) if n[0] != ".")
    assert "/neu%20é%20dir/in/" in entries and "%C3%A9" not in entries
    flush_files(inp, run.files)
    resume_at(spark, run.flavour, inp, out, ckpt)
    assert read_output(spark, out) == exact(run.files)


@pytest.mark.parametrize("flavour", ["hdfs", "rocksdb_v2"])
def test_a_deleted_state_partition_is_named_and_a_backup_taken_before_runs_exactly(spark, run, tmp_path):
    """A state partition's whole directory deleted (a partial copy, a clean-up by hand) leaves no file to
    judge: fsck names the directory from the operator metadata, a new backup of it is refused, Spark indeed
    fails to restart on it, and the fix fsck gives (restore a backup taken before, elsewhere) runs exactly."""
    dest = str(tmp_path / "dest")
    b = backup(run, dest)
    shutil.rmtree(os.path.join(run.checkpoint, "state", "0", "1"))
    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    (missing,) = [x for x in f["findings"] if x["code"] == "state-missing"]
    assert code == 1 and missing["path"].endswith("state/0/1") and "backup restore" in missing["fix"]
    assert "state/0/_metadata/metadata declares 2 partitions" in missing["problem"]
    code, out, err = cli("backup", "create", run.checkpoint, str(tmp_path / "refused"), "--sink", run.output,
                         *INTERVALS)
    assert code == 2 and "state/0/1" in err and not os.path.exists(tmp_path / "refused"), (out, err)

    flush_files(run.input, run.files)
    with pytest.raises(Exception) as failed:  # what fsck said: Spark cannot load the partition's state
        run.run_query(spark)
    assert "CANNOT_LOAD_STATE_STORE" in str(failed.value), failed.value

    inp, out, ckpt = restore_elsewhere(run, dest, b["backup_id"], tmp_path / "restored")
    resume_at(spark, run.flavour, inp, out, ckpt)
    assert read_output(spark, out) == exact(run.files)


@pytest.mark.parametrize("flavour", ["rocksdb_v2"])
def test_a_restore_undone_leaves_a_location_spark_starts_afresh_at(spark, run, tmp_path):
    """``backup restore`` into a new location, then ``undo``: the undo took the restore's files away but left
    its directories, and Spark refused every start there (an empty ``state/0/<partition>``:
    STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY), with nothing of ours saying why. The undo removes the
    directories it emptied; Spark then starts the query afresh and writes every window exactly once."""
    dest = str(tmp_path / "dest")
    b = backup(run, dest)
    inp, out, ckpt = restore_elsewhere(run, dest, b["backup_id"], tmp_path / "t")
    assert os.listdir(os.path.join(ckpt, "state", "0"))  # the restore made state directories
    code, r = cli_json("undo", ckpt, "--yes")
    assert code == 0, r
    left = [d for top in (ckpt, out) for d, _, _ in os.walk(top) if d != top]
    assert not left, left
    flush_files(inp, run.files)
    resume_at(spark, run.flavour, inp, out, ckpt)
    assert read_output(spark, out) == exact(run.files)
