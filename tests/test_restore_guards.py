"""``backup restore`` guards and reports, found by a hostile review. Fast tier: ``benchmarks.check_pass.Stream``
(a checkpoint and its file sink in Spark's formats), no Spark.

* A target whose ledger directory (``.checkpoint-ops/<name>/ledger`` beside it) already holds another
  checkpoint's batch ledger is refused, naming that directory, and nothing changes: restored over it, the two
  ledgers merged silently (fsck then reported a false error, inspect a wrong rollback window). A restore
  undone leaves the ledger empty, so restoring again there still works, and no directory it made.
* ``result.requests`` and ``result.retries`` count each file manager once: the ``ledger`` root shares the
  checkpoint's, and reporting it under both roots counted every checkpoint request twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import boto3
import pytest

from benchmarks.check_pass import INTERVAL, Stream
from tests.helpers import cli, cli_json, sigint_as_ctrl_c

I = ("--source-compact-interval", str(INTERVAL), "--sink-compact-interval", str(INTERVAL))


def _backup(root: str, dest: str, batches: int) -> str:
    """A synthetic query of ``batches`` batches, its ledger synced, backed up into ``dest``: the backup id."""
    s = Stream(root, retain=100)
    for _ in range(batches):
        s.batch()
    code, r = cli_json("ledger", "sync", s.ckpt, "--sink", s.out, *I)
    assert code == 0, r
    code, r = cli_json("backup", "create", s.ckpt, dest, "--sink", s.out, *I)
    assert code == 0, r
    return r["backup_id"]


def _checkpoint_backup(root: str, dest: str) -> str:
    """A synthetic query of 4 batches (no sink) backed up into ``dest``: the backup id."""
    s = Stream(root, retain=100)
    for _ in range(4):
        s.batch()
    code, r = cli_json("backup", "create", s.ckpt, dest, *I)
    assert code == 0, r
    return r["backup_id"]


def _restore_in_a_process(dest: str, backup_id: str, target: str, env: dict, **kw):
    """``checkpoint-ops backup restore`` of ``backup_id`` into ``target`` as a process of its own (``env`` added to
    the environment; ``kw`` to ``subprocess.run``)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", "backup", "restore", dest, backup_id, target,
                           "--yes"], capture_output=True, text=True, timeout=300, env=dict(os.environ, **env), **kw)


def _files(top: str) -> dict[str, str]:
    """rel path -> sha256 of every file under ``top`` (hidden ones, ours, included)."""
    return {os.path.relpath(os.path.join(d, n), top): hashlib.sha256(open(os.path.join(d, n), "rb").read()).hexdigest()
            for d, _, names in os.walk(top) for n in names}


def test_a_restore_over_another_checkpoints_ledger_is_refused_and_changes_nothing(tmp_path):
    """``rm -rf ckpt out`` leaves the hidden ledger beside them; restoring another backup there merged the two
    ledgers (exit 0). Refused now (exit 2, the ledger directory named with what to do), nothing written; with
    the ledger removed as the fix says, the restore goes through. Undo of a restore empties its ledger: a
    restore undone and restored again is not refused."""
    dest = str(tmp_path / "dest")
    first = _backup(str(tmp_path / "a"), dest, 7)
    second = _backup(str(tmp_path / "b"), dest, 4)
    target = tmp_path / "t"
    ckpt, out = str(target / "ckpt"), str(target / "out")
    ledger = str(target / ".checkpoint-ops" / "ckpt" / "ledger")

    def restore(backup_id: str) -> tuple[int, dict]:
        return cli_json("backup", "restore", dest, backup_id, ckpt, "--sink-target", out, "--yes")

    # restored, undone, restored again: the undo left the ledger empty, so the second restore is accepted
    assert restore(first)[0] == 0
    code, r = cli_json("undo", ckpt, "--yes")
    assert code == 0, r
    # and no directory the restore made is left (empty ones under state/ stop Spark's next start)
    left = [d for top in (ckpt, out) for d, _, _ in os.walk(top) if d != top]
    assert not left, left
    code, r = restore(first)
    assert code == 0, r

    # the checkpoint and its output removed by hand: the ledger beside them stays, and is not the next one's
    shutil.rmtree(ckpt)
    shutil.rmtree(out)
    before = _files(str(target))
    code, r = restore(second)
    assert code == 2, r
    assert r["path"].rstrip("/").endswith("/.checkpoint-ops/ckpt/ledger"), r
    assert "batch ledger" in r["problem"] and "rm -r" in r["fix"] and "another" in r["fix"], r
    assert _files(str(target)) == before, "a refused restore changed files"

    shutil.rmtree(ledger)  # what the fix says to do
    code, r = restore(second)
    assert code == 0, r
    code, shown = cli_json("ledger", "show", ckpt)
    assert code == 0, shown
    assert shown["batches"]["last"] == 3, shown  # the second backup's batches only (0..3), none of the first's


def _total(per_store: dict) -> int:
    return sum(n for kinds in per_store.values() for n in kinds.values())


def test_restore_reports_each_file_manager_once(tmp_path, s3_server, bucket, faulty_s3):
    """The targets on the S3 server behind the proxy (no faults): the requests ``result.requests`` reports for
    them never exceed what the proxy saw (the leases' own requests are not in it). Before, the ``ledger`` root
    repeated the ``checkpoint``'s counts (the same file manager), so the report exceeded what was sent."""
    dest = str(tmp_path / "dest")  # the backup on local disk: every request through the proxy is the targets'
    backup_id = _backup(str(tmp_path / "a"), dest, 7)
    options = json.dumps({"endpoint_url": faulty_s3.endpoint})
    faulty_s3.reset_stats()
    code, r = cli_json("backup", "restore", dest, backup_id, f"s3://{bucket}/t/ckpt", "--sink-target",
                       f"s3://{bucket}/t/out", "--yes", "--storage-options", options)
    assert code == 0, r
    seen = sum(faulty_s3.reset_stats().requests.values())
    requests = r["result"]["requests"]
    targets = {rid: kinds for rid, kinds in requests.items() if rid not in ("source", "backup")}
    assert 0 < _total(targets) <= seen, (requests, seen)
    assert "ledger" not in requests and "ledger" not in r["result"]["retries"], requests
    assert boto3.client("s3", endpoint_url=s3_server).list_objects_v2(Bucket=bucket, Prefix="t/.checkpoint-ops/ckpt/"
                                                                      "ledger/")["KeyCount"] > 0  # it has a ledger


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_directory_in_the_target_is_refused_before_anything_is_written(tmp_path, where, request):
    """Empty directories in an otherwise empty target (on S3 the markers S3A's ``mkdirs`` leaves). ``metadata/``,
    where the restore writes a file: it planned, fenced, failed at that write ("Is a directory") and sent the user
    to a resume with nothing to do. ``commits/9/`` or ``offsets/9/`` beyond the backup's last batch: the restore
    reported success and Spark then failed (CONCURRENT_STREAM_LOG_UPDATE: "Multiple streaming jobs detected for 9";
    both found by hostile reviews). Every directory is refused up front now (exit 2, named, nothing written); with
    them removed as the fix says, the restore goes through (on S3 the target's own marker is no directory in it)."""
    dest = str(tmp_path / "dest")
    backup_id = _checkpoint_backup(str(tmp_path / "a"), dest)
    if where == "local":
        target = str(tmp_path / "t")
        made = ["metadata", "offsets/3/x", "offsets/9", "commits/9", "state"]
        for rel in made:
            os.makedirs(os.path.join(target, rel))
        options = []

        def state():
            return sorted(os.path.relpath(os.path.join(d, n), target) for d, dirs, files in os.walk(target)
                          for n in dirs + files)

        def remove_all():
            for name in os.listdir(target):
                shutil.rmtree(os.path.join(target, name))
    else:
        s3_server, bucket = request.getfixturevalue("s3_server"), request.getfixturevalue("bucket")
        client = boto3.client("s3", endpoint_url=s3_server)
        target = f"s3://{bucket}/t/ckpt"
        made = ["metadata", "commits/9"]
        for key in ["t/ckpt/"] + [f"t/ckpt/{rel}/" for rel in made]:
            client.put_object(Bucket=bucket, Key=key, Body=b"")
        options = ["--storage-options", json.dumps({"endpoint_url": s3_server})]

        def state():
            return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="t/").get("Contents", []))

        def remove_all():
            for rel in made:
                client.delete_object(Bucket=bucket, Key=f"t/ckpt/{rel}/")
    before = state()
    code, r = cli_json("backup", "restore", dest, backup_id, target, "--yes", *options)
    assert code == 2, r
    assert "with no file below" in r["problem"] and r["fix"].startswith("remove them"), r
    assert all(rel in r["problem"] for rel in made if rel != "offsets/3"), r  # each (the deepest, for a tree)
    assert state() == before, "the refused restore changed the target"
    remove_all()
    code, r = cli_json("backup", "restore", dest, backup_id, target, "--yes", *options)
    assert code == 0, r
    code, r = cli_json("fsck", target, *options)
    assert code == 0, r


def _kill_once_fenced(restore: list[str], target: str) -> None:
    """Run the restore command ``restore`` killed at its first crash point that leaves ``target`` fenced (the
    restore's parent directory is emptied before each try)."""
    from tests.crash import NEVER, ForkRunner

    runner = ForkRunner()
    try:
        assert runner.run(*restore, kill_at=NEVER)[0] == 0
        for k in range(1, runner.mutations):  # the first point at which the target is fenced
            shutil.rmtree(os.path.dirname(target))
            assert runner.run(*restore, kill_at=k)[0] == -9
            metadata = os.path.join(target, "metadata")
            if os.path.exists(metadata) and b"checkpoint-ops" in open(metadata, "rb").read():
                return
        raise AssertionError("no kill point left the target fenced")
    finally:
        runner.close()


def test_running_an_interrupted_restore_again_says_to_finish_it(tmp_path):
    """A restore killed once it fenced its target (``metadata`` holds the fence): running the same restore
    again is refused with the way to finish it (``resume``) or revert it (``undo``), not told to pick another,
    empty location, which would leave the fenced half-target behind. ``resume`` then finishes it."""
    import subprocess
    import sys

    from checkpoint_ops.fence import is_fence
    from checkpoint_ops.storage.killswitch import KILL_ENV

    dest = str(tmp_path / "dest")
    backup_id = _backup(str(tmp_path / "q"), dest, 8)
    target, out = str(tmp_path / "target"), str(tmp_path / "target-out")
    restore = ["backup", "restore", dest, backup_id, target, "--sink-target", out, "--yes"]
    for kill_at in range(1, 60):  # the first crash-switch count that leaves the target fenced
        for d in (target, out):
            shutil.rmtree(d, ignore_errors=True)
        ops = os.path.join(str(tmp_path), ".checkpoint-ops")
        shutil.rmtree(ops, ignore_errors=True)
        killed = subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", *restore],
                                env=dict(os.environ, **{KILL_ENV: str(kill_at)}), capture_output=True)
        assert killed.returncode == -9, killed.stderr[-2000:]
        metadata = os.path.join(target, "metadata")
        if os.path.exists(metadata) and is_fence(open(metadata, "rb").read()):
            break
    else:
        raise AssertionError("no killed restore left its target fenced")
    before = _files(str(tmp_path))
    code, r = cli_json(*restore)
    assert code == 1, r
    assert "interrupted" in r["problem"] and f"checkpoint-ops resume {target}" in r["fix"], r
    assert f"checkpoint-ops undo {target}" in r["fix"], r
    assert _files(str(tmp_path)) == before
    code, r = cli_json("resume", target, "--yes")
    assert code == 0, r
    code, r = cli_json("fsck", target, "--sink", out, *I)
    assert code == 0 and r["findings"] == [], r


def test_fsck_of_a_target_a_killed_restore_fenced_names_the_restore_not_a_new_query(tmp_path):
    """A restore killed at any point after it fenced its target, while offsets/ may hold only its temp files:
    fsck names the interrupted restore, never ``new-query-refused`` (whose fix, deleting the temp files, is wrong
    for a restore's own files: resume or undo finishes it)."""
    import subprocess
    import sys

    from checkpoint_ops.fence import is_fence
    from checkpoint_ops.storage.killswitch import KILL_ENV

    dest = str(tmp_path / "dest")
    backup_id = _backup(str(tmp_path / "q"), dest, 8)
    target, out = str(tmp_path / "target"), str(tmp_path / "target-out")
    restore = ["backup", "restore", dest, backup_id, target, "--sink-target", out, "--yes"]
    judged = 0
    for kill_at in range(1, 60):
        for d in (target, out, os.path.join(str(tmp_path), ".checkpoint-ops")):
            shutil.rmtree(d, ignore_errors=True)
        killed = subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", *restore],
                                env=dict(os.environ, **{KILL_ENV: str(kill_at)}), capture_output=True)
        metadata = os.path.join(target, "metadata")
        if killed.returncode != -9 or not (os.path.exists(metadata) and is_fence(open(metadata, "rb").read())):
            continue
        code, r = cli_json("fsck", target)
        codes = [f["code"] for f in r["findings"] if f["severity"] == "error"]
        assert "operation-interrupted" in codes and "new-query-refused" not in codes, (kill_at, r)
        judged += 1
    assert judged >= 10, judged


def test_a_backup_of_a_target_a_killed_restore_fenced_names_the_restore(tmp_path):
    """``backup create`` of a target whose restore was killed before it wrote a commit said "nothing committed
    yet" (the check ran before the fence's): it now names the interrupted restore, with resume and undo."""
    dest = str(tmp_path / "dest")
    backup_id = _backup(str(tmp_path / "q"), dest, 3)
    target = str(tmp_path / "t" / "ckpt")
    restore = ["backup", "restore", dest, backup_id, target, "--sink-target", str(tmp_path / "t" / "out"), "--yes"]
    _kill_once_fenced(restore, target)
    assert not os.path.exists(os.path.join(target, "commits", "0"))
    code, r = cli_json("backup", "create", target, str(tmp_path / "dest2"))
    assert code == 1, r
    assert "a checkpoint-ops restore is in progress or was interrupted here" in r["problem"], r
    assert f"checkpoint-ops resume {target}" in r["fix"] and f"checkpoint-ops undo {target}" in r["fix"], r


def test_a_restore_its_resume_and_a_backup_say_they_wait_for_a_running_prune(tmp_path):
    """A live prune lock at the destination makes a restore, the resume of a killed one and a backup wait (up to
    ten minutes) before they read an object: they waited without a word, like a hang (a hostile review). Each now
    says on stderr that a garbage collection is running, whose, and that it waits; each finishes once the lock is
    released."""
    import socket
    import subprocess
    import sys
    import time

    from checkpoint_ops.backup.repository import Repository

    dest = str(tmp_path / "dest")
    backup_id = _backup(str(tmp_path / "q"), dest, 4)
    repo = Repository.open(dest)
    target, out = str(tmp_path / "t" / "ckpt"), str(tmp_path / "t" / "out")
    restore = ["backup", "restore", dest, backup_id, target, "--sink-target", out, "--yes"]
    _kill_once_fenced(restore, target)  # a restore killed once it fenced its target

    def waits(args: list[str], claimed) -> str:
        """Run ``args`` while a prune lock is held; released once the command has written its claim: stderr."""
        lock = repo.hold_prune_lock()
        try:
            proc = subprocess.Popen([sys.executable, "-m", "checkpoint_ops.cli", *args], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            deadline = time.time() + 120
            while not claimed() and proc.poll() is None and time.time() < deadline:
                time.sleep(0.05)
            time.sleep(1.5)  # it sees the lock at least once more (it looks every second)
            assert proc.poll() is None, proc.communicate()  # still waiting
        finally:
            lock.release()
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, (stdout, stderr)
        assert f"checkpoint-ops: warning: {dest}: a garbage collection of this backup destination is running, by " \
            "checkpoint-ops backup prune " \
            f"(host {socket.gethostname()}, pid {os.getpid()}, since " in stderr, stderr  # the lock's holder: this test
        return stderr

    def restoring() -> bool:
        return any(c.live and c.restoring for c in repo.intents())

    said = waits(["resume", target, "--yes"], restoring)
    assert "the resume of the restore waits for it to finish (at most 10 minutes)" in said, said
    assert cli_json("fsck", target, "--sink", out, *I)[0] == 0

    target2, out2 = str(tmp_path / "t2" / "ckpt"), str(tmp_path / "t2" / "out")
    said = waits(["backup", "restore", dest, backup_id, target2, "--sink-target", out2, "--yes"], restoring)
    assert "the restore waits for it to finish" in said, said

    def backing_up() -> bool:
        return any(c.live and not c.restoring for c in repo.intents())

    said = waits(["backup", "create", target, dest, "--sink", out, *I], backing_up)
    assert "this backup waits for it to finish" in said, said

    alone = subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", "backup", "restore", dest, backup_id,
                            str(tmp_path / "t3" / "ckpt"), "--sink-target", str(tmp_path / "t3" / "out"), "--yes"],
                           capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0 and "garbage collection" not in alone.stderr, alone.stderr  # no prune: no notice


def test_a_backup_stopped_with_ctrl_c_says_to_run_it_again(tmp_path):
    """Ctrl-C while `backup create` copied (a real SIGINT, from the kill switch, at an object's write): it printed the
    generic "resume PATH / undo PATH" advice, though a backup journals nothing and only reads the checkpoint (a
    hostile review). It says the backup was not published and to run it again; run again, it is whole."""
    import subprocess
    import sys

    dest = str(tmp_path / "dest")
    s = Stream(str(tmp_path / "q"), retain=100)
    for _ in range(6):
        s.batch()
    stopped = subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", "backup", "create", s.ckpt, dest, "--sink",
                              s.out, *I], capture_output=True, text=True, timeout=300,
                             env=dict(os.environ, CHECKPOINT_OPS_KILL_AT="8", CHECKPOINT_OPS_KILL_SIGNAL="INT"),
                             preexec_fn=sigint_as_ctrl_c)
    assert stopped.returncode == 130, stopped.stderr
    assert "interrupted: the backup stopped before it was published" in stopped.stderr, stopped.stderr
    assert "run the same command again to take the backup" in stopped.stderr and "resume" not in stopped.stderr
    code, r = cli_json("backup", "create", s.ckpt, dest, "--sink", s.out, *I)
    assert code == 0, r
    code, v = cli_json("backup", "verify", dest)
    assert code == 0 and [b["backup_id"] for b in v["backups"]] == [r["backup_id"]], v


def test_ctrl_c_as_a_restore_releases_its_intent_leaves_no_intent(tmp_path):
    """Ctrl-C just as a finished restore deletes its intent in the destination: the intent was left there until it
    went stale (a review). The first Ctrl-C is now held until the intent is deleted: the restore says it finished,
    and nothing of it is left in the destination."""
    dest = str(tmp_path / "dest")
    backup_id = _checkpoint_backup(str(tmp_path / "q"), dest)

    def restore(target: str, env: dict):
        return _restore_in_a_process(dest, backup_id, target, env, preexec_fn=sigint_as_ctrl_c)

    trace = str(tmp_path / "trace.txt")
    done = restore(str(tmp_path / "traced"), {"CHECKPOINT_OPS_KILL_AT": "1000000", "CHECKPOINT_OPS_KILL_TRACE": trace})
    assert done.returncode == 0, done.stderr
    steps = [line.split("\t", 1) for line in open(trace).read().splitlines()]
    (release,) = [int(k) for k, what in steps if "/restore-" in what and what.startswith(dest)][-1:]
    stopped = restore(str(tmp_path / "target"), {"CHECKPOINT_OPS_KILL_AT": str(release),
                                                  "CHECKPOINT_OPS_KILL_SIGNAL": "INT"})
    assert stopped.returncode == 130, (stopped.stdout, stopped.stderr)
    left = [os.path.join(d, n) for d, _, names in os.walk(dest) for n in names if "restore-" in n]
    assert not left, left
    assert "interrupted after the restore finished" in stopped.stderr, stopped.stderr
    code, v = cli_json("backup", "verify", dest)
    assert code == 0, v


def test_ctrl_c_as_a_published_backup_releases_its_intent_says_it_is_complete(tmp_path):
    """Ctrl-C just as `backup create` deleted its intent, after the manifest was stored: it said the backup "stopped
    before it was published ... run the same command again", though `backup list` showed it (a hostile review). The
    held Ctrl-C is announced, the backup is reported complete, the exit code is 0 and the intent is gone."""
    import subprocess
    import sys

    dest = str(tmp_path / "dest")
    s = Stream(str(tmp_path / "q"), retain=100)
    for _ in range(4):
        s.batch()

    def create(env: dict) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", "backup", "create", s.ckpt, dest, *I],
                              capture_output=True, text=True, timeout=300, env=dict(os.environ, **env),
                              preexec_fn=sigint_as_ctrl_c)

    trace = str(tmp_path / "trace.txt")
    done = create({"CHECKPOINT_OPS_KILL_AT": "1000000", "CHECKPOINT_OPS_KILL_TRACE": trace})
    assert done.returncode == 0, done.stderr
    steps = [line.split("\t", 1) for line in open(trace).read().splitlines()]
    release = [int(k) for k, what in steps if "/intents/" in what][-1]
    shutil.rmtree(dest)
    stopped = create({"CHECKPOINT_OPS_KILL_AT": str(release), "CHECKPOINT_OPS_KILL_SIGNAL": "INT"})
    assert stopped.returncode == 0, (stopped.stdout, stopped.stderr)
    assert "interrupted: releasing the backup intent in the backup destination first" in stopped.stderr, stopped.stderr
    assert "was published: it is complete" in stopped.stderr and "run the same command again" not in stopped.stderr
    assert not [n for d, _, names in os.walk(dest) for n in names if "intents" in d], list(os.walk(dest))
    code, listed = cli_json("backup", "list", dest)
    assert code == 0 and len(listed["backups"]) == 1, listed


def test_ctrl_c_as_a_finished_prune_releases_its_lock_leaves_the_prune_done(tmp_path):
    """Ctrl-C just as `backup prune` deleted its lock, after it had deleted everything it planned: it said the prune
    "stopped part-way ... run the same command again" (a hostile review). The held Ctrl-C is announced, and the prune
    stands: exit 0, its result printed, no lock left."""
    import subprocess
    import sys

    dest = str(tmp_path / "dest")
    s = Stream(str(tmp_path / "q"), retain=100)
    for _ in range(3):
        for _ in range(3):
            s.batch()
        code, r = cli_json("backup", "create", s.ckpt, dest, *I)
        assert code == 0, r

    def prune(where: str, env: dict) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", "backup", "prune", where, "--keep-last", "1",
                               "--yes", "--json"], capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, **env), preexec_fn=sigint_as_ctrl_c)

    traced, trace = str(tmp_path / "traced"), str(tmp_path / "trace.txt")
    shutil.copytree(dest, traced)
    done = prune(traced, {"CHECKPOINT_OPS_KILL_AT": "1000000", "CHECKPOINT_OPS_KILL_TRACE": trace})
    assert done.returncode == 0, done.stderr
    steps = [line.split("\t", 1) for line in open(trace).read().splitlines()]
    release = [int(k) for k, what in steps if "/locks/" in what][-1]
    stopped = prune(dest, {"CHECKPOINT_OPS_KILL_AT": str(release), "CHECKPOINT_OPS_KILL_SIGNAL": "INT"})
    assert stopped.returncode == 0, (stopped.stdout, stopped.stderr)
    assert "interrupted: releasing the prune lock in the backup destination first" in stopped.stderr, stopped.stderr
    assert "part-way" not in stopped.stderr and json.loads(stopped.stdout), stopped.stdout
    locks = os.path.join(dest, "locks")
    assert not os.path.isdir(locks) or not os.listdir(locks), os.listdir(locks)
    code, listed = cli_json("backup", "list", dest)
    assert code == 0 and len(listed["backups"]) == 1, listed


def test_a_restore_into_an_empty_location_stopped_before_its_fence_is_no_new_query(tmp_path):
    """A restore into a new location killed as it writes its fence (the first file it puts there) leaves the
    location empty, or holding only that write's temp file, with its journal beside it. A query started there would
    start afresh where the restore puts a checkpoint: the compat check refuses, and the health check fails, each
    naming the resume (before, both called the location a query not run yet); the resume then drops the restore
    (it had changed nothing), and the restore run again puts the checkpoint there. An undo of a restore stopped
    part-way is named with its undo."""
    import subprocess
    import sys
    import uuid

    from checkpoint_ops.compat import check_compat
    from checkpoint_ops.errors import BadInputError
    from checkpoint_ops.model.checkpoint import Checkpoint
    from checkpoint_ops.query_owner import not_started
    from checkpoint_ops.storage import open_file_manager

    dest = str(tmp_path / "dest")
    backup_id = _checkpoint_backup(str(tmp_path / "q"), dest)

    def restore(target: str, env: dict):
        return _restore_in_a_process(dest, backup_id, target, env)

    trace = str(tmp_path / "trace.txt")
    traced = str(tmp_path / "traced")
    done = restore(traced, {"CHECKPOINT_OPS_KILL_AT": "1000000", "CHECKPOINT_OPS_KILL_TRACE": trace})
    assert done.returncode == 0, done.stderr
    steps = [line.split("\t", 1) for line in open(trace).read().splitlines()]
    fence = min(int(k) for k, what in steps if what == f"{traced}/metadata")
    assert not [what for k, what in steps if int(k) < fence and what.startswith(traced + "/")
                and ".checkpoint-ops.lease" not in what], steps  # the first file it puts there but its lease
    for temp in (False, True):
        target = str(tmp_path / f"target-{temp}")
        stopped = restore(target, {"CHECKPOINT_OPS_KILL_AT": str(fence)})
        assert stopped.returncode == -9, stopped.stderr
        os.makedirs(target, exist_ok=True)
        if temp:  # killed during that write rather than before it
            with open(os.path.join(target, f".metadata.{uuid.uuid4()}.tmp"), "wb") as f:
                f.write(b'{"id":"')
        assert all(n.endswith(".tmp") or "checkpoint-ops.lease" in n for n in os.listdir(target)), os.listdir(target)
        resume = f"checkpoint-ops resume {target}"
        judged = not_started(*open_file_manager(target), "q")
        assert judged is not None and "a checkpoint-ops restore (journaled in " in judged.problem, judged
        assert resume in judged.fix, judged
        with pytest.raises(BadInputError, match="stopped part-way at this location") as refused:
            check_compat(Checkpoint(*open_file_manager(target)), None, lambda spark: None)
        assert resume in refused.value.fix, refused.value.render()
        code, dropped = cli_json("resume", target, *I)  # it had changed nothing: dropped, to be planned again
        assert code == 1 and "plan the restore again" in dropped["fix"], dropped
        assert not_started(*open_file_manager(target), "q").problem is None  # nothing under way there any more
        code, again = cli_json("backup", "restore", dest, backup_id, target, "--yes")
        assert code == 0, again
        assert not_started(*open_file_manager(target), "q") is None  # a checkpoint is there now
        assert _files(target) == _files(traced), target  # the checkpoint the backup holds
        code, report = cli_json("fsck", target, *I)
        assert code in (0, 1) and not [f for f in report["findings"] if f["severity"] == "error"], report

    # an undo of a restore stopped part-way (as it marks the journal undone): its undo ends it, not a resume, which
    # would put the restored checkpoint back (a hostile review)
    def undo(target: str, env: dict):
        return subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", "undo", target, "--yes"],
                              capture_output=True, text=True, timeout=300, env=dict(os.environ, **env))

    for name in ("undo-traced", "undo-killed"):
        assert _restore_in_a_process(dest, backup_id, str(tmp_path / name), {}).returncode == 0
    undo_trace = str(tmp_path / "undo-trace.txt")
    traced_undo = undo(str(tmp_path / "undo-traced"), {"CHECKPOINT_OPS_KILL_AT": "1000000",
                                                      "CHECKPOINT_OPS_KILL_TRACE": undo_trace})
    assert traced_undo.returncode == 0, traced_undo.stderr
    undone = max(int(k) for k, what in (line.split("\t", 1) for line in open(undo_trace).read().splitlines())
                 if what.endswith("/undone"))
    target = str(tmp_path / "undo-killed")
    assert undo(target, {"CHECKPOINT_OPS_KILL_AT": str(undone)}).returncode == -9
    judged = not_started(*open_file_manager(target), "q")
    assert judged is not None and "an undo of a checkpoint-ops restore" in judged.problem, judged
    assert f"checkpoint-ops undo {target}" in judged.fix and "resume" not in judged.fix, judged
    assert undo(target, {}).returncode == 0
    assert not_started(*open_file_manager(target), "q").problem is None  # undone: a new query may start there


@pytest.mark.parametrize("journals, expected", [
    ([("restore", '{"operation": "restore"}', ())], "resume"),
    ([("restore", '{"operation": "restore"}', ("applied",))], None),  # its checkpoint deleted since: a fresh start
    ([("restore", '{"operation": "restore"}', ("applied", "undoing"))], "undo"),
    ([("restore", '{"operation": "restore"}', ("applied", "undoing", "undone"))], None),
    ([("rollback", '{"operation": "rollback"}', ())], None),  # beside a checkpoint deleted on purpose: no block
    ([("restore", '{"operation": "restore"}', ()),
      ("lease-break", '{"operation": "lease-break", "undoable": false}', ())], "resume"),  # looked past
    ([("restore", '{"operation": "restore"}', ()), ("rollback", '{"operation": "rollback"}', ("applied",))], None),
    ([("restore", "{", ())], "resume"),  # damaged: resume names the damage
    ([("restore", '{"operation": "restore", "format": 99}', ())], "resume"),  # a newer release's
    ([("rollback", "{", ())], None),
], ids=["unfinished", "applied", "undoing", "undone", "rollback", "past-a-lease-break", "under-a-newer-one",
        "damaged", "newer-format", "damaged-rollback"])
def test_which_journal_beside_an_empty_location_makes_it_no_new_query(tmp_path, journals, expected):
    """``restore_stopped_at`` judges the journal ``resume`` and ``undo`` act on, and only a restore's speaks for an
    empty location (a review: an undo stopped part-way was named with resume, a rollback's journal left beside a
    checkpoint deleted on purpose blocked a fresh start, a damaged restore journal let one through)."""
    from checkpoint_ops.journal import restore_stopped_at
    from checkpoint_ops.storage import open_file_manager

    target = tmp_path / "ck"
    target.mkdir()
    for n, (operation, plan, markers) in enumerate(journals):
        journal = tmp_path / ".checkpoint-ops" / "ck" / "journal" / f"20261130T00000{n}.000000Z-{operation}-0a1b2c3d"
        journal.mkdir(parents=True)
        whole = plan.replace('"operation"', f'"format": 2, "op_id": "{journal.name}", "operation"')
        (journal / "plan.json").write_text(plan if plan == "{" or "format" in plan else whole)
        for marker in markers:
            (journal / marker).write_text("{}")
    stopped = restore_stopped_at(*open_file_manager(str(target)))
    if expected is None:
        assert stopped is None, stopped
    else:
        assert stopped is not None and stopped.command == f"checkpoint-ops {expected} {target}", stopped
        assert stopped.fix.startswith(f"run `checkpoint-ops {expected} {target}` first"), stopped.fix


def test_a_restore_warns_when_relocated_input_files_have_other_times_than_logged(tmp_path):
    """Input copied to its new place without its modification times, then ``--relocate``d: Spark's file source
    forgets the files it read that are more than maxFileAge older than the newest, and reads a copy with a newer
    time again: duplicated rows (a hostile review saw a window counted twice). The restore said nothing; its plan
    now warns, naming a file and both times. With the times kept, no warning."""
    from benchmarks.check_pass import T0

    dest = str(tmp_path / "dest")
    backup_id = _checkpoint_backup(str(tmp_path / "a"), dest)
    copy = tmp_path / "in2"
    copy.mkdir()
    for b in range(4):
        (copy / f"part-{b:06d}.json").write_text("{}\n")
    for keep, target in ((False, "t1"), (True, "t2")):
        if keep:  # as `cp -a` keeps them: the time the source log recorded
            for b in range(4):
                os.utime(copy / f"part-{b:06d}.json", ns=((T0 + b) * 10**6, (T0 + b) * 10**6))
        code, r = cli_json("backup", "restore", dest, backup_id, str(tmp_path / target), "--relocate",
                           f"/in={copy}", "--dry-run")
        assert code == 0, r
        warned = [w for w in r["plan"]["warnings"] if "relocated input files" in w]
        if keep:
            assert not warned, r["plan"]["warnings"]
        else:
            assert len(warned) == 1 and warned[0].startswith("4 of 4 relocated input files checked"), warned
            assert "part-000000.json" in warned[0] and "duplicated rows" in warned[0] and "cp -a" in warned[0]


def test_a_target_that_is_not_empty_is_named_by_its_own_files_before_their_sidecars(tmp_path):
    """The refusal listed ``.metadata.crc, commits/.0.crc, ...`` first (review): Hadoop's hidden sidecars sorted
    before the files a user recognises. Spark's own names come first now, and nothing is written."""
    backup_id = _backup(str(tmp_path / "q"), str(tmp_path / "dest"), 3)
    target = tmp_path / "target"
    (target / "commits").mkdir(parents=True)
    for rel in ("metadata", ".metadata.crc", "commits/0", "commits/.0.crc"):
        (target / rel).write_text("{}")
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    code, r = cli_json("backup", "restore", str(tmp_path / "dest"), backup_id, str(target), "--sink-target",
                       str(tmp_path / "out2"))
    assert code == 2 and "it holds commits/0, metadata, .metadata.crc, commits/.0.crc" in r["problem"], r
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("presses, expected", [(1, 2), (2, -2)], ids=["one-is-let-go", "a-second-stops-it"])
def test_a_ctrl_c_after_the_command_returned_changes_nothing_and_a_second_one_stops_it(tmp_path, presses, expected):
    """A hostile review's restore printed its result, then died of a Ctrl-C that came while the interpreter shut down
    (exit 130, for a command that had finished and returned 0). The console script lets a first one go once the
    command returned its exit code; a second one stops the process at once, as a Ctrl-C does. The command here
    returns 2 (no such checkpoint); the presses come after it returned, as the interpreter would shut down."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import os, signal, sys, time
        sys.argv = ["checkpoint-ops", "history", {str(tmp_path / "nothing-here")!r}]
        from checkpoint_ops.cli import main
        code = main()
        for _ in range({presses}):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.3)
        sys.exit(code)
    """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120,
                          start_new_session=True, preexec_fn=sigint_as_ctrl_c)
    assert done.returncode == expected, (done.returncode, done.stderr[-2000:])
    assert "no such checkpoint" in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr[-2000:]


def test_a_restore_with_the_wrong_number_of_sink_targets_says_what_to_give(tmp_path):
    """Refused with no ``fix`` (a hostile review): it names what to give now, and nothing is written."""
    dest = str(tmp_path / "dest")
    backup_id = _backup(str(tmp_path / "q"), dest, 3)
    for extra, fix in (((), "--sink-target EMPTY_DIR once for each, in that order"),
                       (("--sink-target", tmp_path / "o1", "--sink-target", tmp_path / "o2"),
                        "--sink-target EMPTY_DIR once for each, in that order")):
        code, r = cli_json("backup", "restore", dest, backup_id, tmp_path / "t", *extra, "--yes")
        assert code == 2 and "give one target for each" in r["problem"] and fix in (r["fix"] or ""), r
        assert not os.path.exists(tmp_path / "t") and not os.path.exists(tmp_path / "o1")
    no_sink = _checkpoint_backup(str(tmp_path / "plain"), str(tmp_path / "dest2"))
    code, r = cli_json("backup", "restore", tmp_path / "dest2", no_sink, tmp_path / "t", "--sink-target", tmp_path / "o",
                       "--yes")
    assert code == 2 and r["fix"] == "drop --sink-target: the backup holds no file sink", r


def test_a_backup_interrupted_once_its_manifest_is_stored_says_it_is_complete(tmp_path, monkeypatch, capsys):
    """Ctrl-C that lands once the manifest is stored (in the store's sync after it, as a hostile review saw) said
    "the backup stopped before it was published ... run the same command again", though `backup list` showed the
    backup. It now says the backup is complete and that nothing is to be run again (exit 130: its output was not
    shown). The interrupt is injected right after the manifest's write returns."""
    from checkpoint_ops import cli
    from checkpoint_ops.backup.repository import Repository

    dest = str(tmp_path / "dest")
    s = Stream(str(tmp_path / "q"), retain=100)
    for _ in range(3):
        s.batch()
    publish = Repository.publish

    def published_then_interrupted(self, backup_id, doc):
        publish(self, backup_id, doc)
        raise KeyboardInterrupt

    monkeypatch.setattr(Repository, "publish", published_then_interrupted)
    code = cli.main(["backup", "create", s.ckpt, dest, "--sink", s.out, *I])
    err = capsys.readouterr().err
    monkeypatch.undo()
    code_listed, listed = cli_json("backup", "list", dest)
    [backup] = listed["backups"]
    assert code == 130 and f"interrupted after backup {backup['id']} was published: it is complete" in err, err
    assert "nothing to run again" in err and "stopped before it was published" not in err, err
    assert cli_json("backup", "verify", dest)[0] == 0


def test_a_backup_prune_interrupted_before_its_operation_says_to_run_it_again(tmp_path, monkeypatch, capsys):
    """Ctrl-C while `backup prune` was setting up (before the operation runner, whose interrupts say what to do)
    printed the generic "resume PATH / undo PATH" advice (a hostile review), though a prune journals nothing. It says
    to run it again. The interrupt is injected where the command builds its operation."""
    from checkpoint_ops import cli
    from checkpoint_ops.backup import retention

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(retention.BackupPruneOperation, "__init__", interrupted)
    code = cli.main(["backup", "prune", str(tmp_path / "dest"), "--keep-last", "1", "--yes"])
    err = capsys.readouterr().err
    assert code == 130 and "the backup prune stopped (it journals nothing to resume or undo)" in err, err
    assert "run the backup prune again" in err and "resume" not in err.replace("to resume or undo", ""), err


def test_a_restore_into_a_target_another_restore_is_filling_says_it_is_in_progress(tmp_path):
    """A second restore into the target a running restore is filling said the first "was interrupted", with resume
    and undo as the fix (a hostile review; both were then refused by the lease). While the target's lease is held
    (here: taken in this process for the stopped restore, as the running one holds it), it says the restore is in
    progress and names the holder; once the lease is free, it is the interrupted one again, with resume or undo."""
    from checkpoint_ops.lease import acquire
    from checkpoint_ops.storage import open_file_manager

    dest, target = str(tmp_path / "dest"), str(tmp_path / "target")
    backup_id = _checkpoint_backup(str(tmp_path / "q"), dest)
    trace = str(tmp_path / "trace.txt")
    done = _restore_in_a_process(dest, backup_id, str(tmp_path / "traced"),
                                 {"CHECKPOINT_OPS_KILL_AT": "1000000", "CHECKPOINT_OPS_KILL_TRACE": trace})
    assert done.returncode == 0, done.stderr
    steps = [line.split("\t", 1) for line in open(trace).read().splitlines()]
    fenced = [int(k) for k, what in steps if what.rstrip().endswith("/traced/metadata")][0]
    killed = _restore_in_a_process(dest, backup_id, target, {"CHECKPOINT_OPS_KILL_AT": str(fenced + 3)})
    assert killed.returncode == -9, killed.stderr

    fm, root = open_file_manager(target)
    lease = acquire(fm, root, "a restore still running", heartbeat=False)
    try:
        code, out, err = cli("backup", "restore", dest, backup_id, target, "--yes")
    finally:
        lease.release()
    assert code == 1 and "in progress (its lease is held by" in err and "a restore still running" in err, err
    assert "wait for it to finish" in err and "was interrupted" not in err, err
    code, out, err = cli("backup", "restore", dest, backup_id, target, "--yes")
    assert code == 1 and "was interrupted" in err and "checkpoint-ops resume" in err, err
