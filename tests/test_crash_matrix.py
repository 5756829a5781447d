"""The crash matrix: every operation, killed at every mutating call, on local disk and on the S3 server.

An uninterrupted run, with the switch armed, counts the operation's mutating calls through the file
manager; then for each crash point k the operation is started on a fresh copy and SIGKILLed just before
its k-th call (``CHECKPOINT_OPS_KILL_AT``). ``make reliability`` (``CHECKPOINT_OPS_CRASH_MATRIX=full``)
tries every k; ``make test`` a fixed sample (``tests.crash.kill_points``: the first and last five, eight
spread between, and each write of the journal and of ``metadata`` with the calls either side), which keeps the
suite's time in bounds. After each crash
the recovery a user would run (``rollback --resume`` or the same command again) must leave exactly
the tree an uninterrupted run leaves. For rollback, Spark then resumes from sampled results with
exact output. The rows go to docs/reliability.md.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import time

import boto3
import pytest
import s3fs

from pipelines.event_counts import event_rows, write_event_files
from tests.crash import NEVER, ForkRunner, MatrixRow, kill_points, race, record, tree_digest
from tests.helpers import content_snapshot
from tests.spark_runs import COMPACT_INTERVAL, SparkRun, run_stateless
from tests.test_sink_spark import sink_run  # noqa: F401  (a fixture)
from tests.test_rollback_spark import INTERVALS, exact, finish_and_read, target_before_last_compaction

HDFS = pytest.mark.parametrize("flavour", ["hdfs"])


@pytest.fixture(scope="module")
def runner():
    r = ForkRunner()
    yield r
    r.close()


def _rollback_args(ckpt: str, run, n: int) -> list:
    return ["rollback", ckpt, "--to-batch", n, "--sink", run.output, *INTERVALS, "--yes", "--json"]


def _recover_rollback(runner, ckpt, run, n) -> None:
    code, out, err = runner.run("rollback", ckpt, "--resume", *INTERVALS, "--json")
    if code == 1 and ("nothing to resume" in err or "stopped before changing anything" in err):
        code, out, err = runner.run(*_rollback_args(ckpt, run, n))  # the crash came before any change
    assert code == 0, (out, err)


def matrix(row: MatrixRow, runner, reset, command, recover, snapshot, expected, after=None) -> MatrixRow:
    """Kill ``command`` at each of its crash points (``kill_points``: every mutating call under ``make
    reliability``, a fixed sample in ``make test``); recover each time; compare the tree."""
    reset()
    code, out, err = runner.run(*command, kill_at=NEVER, trace=True)  # armed, as in the killed runs: it counts
    row.total, steps = runner.mutations, runner.steps  # the calls, and names what each changes
    assert code == 0, (out, err)
    assert snapshot() == expected, "the uninterrupted run does not give the expected tree"
    for k in kill_points(row.total, steps):
        reset()
        code, out, err = runner.run(*command, kill_at=k)
        if code != -9:  # an uninterrupted run made fewer calls this time: the points after it are not reached
            assert code == 0 and snapshot() == expected, (k, out, err)
            break
        row.points += 1
        row.tried.append(k)
        try:
            recover()
        except AssertionError as e:
            raise AssertionError(f"recovery after a crash at k={k} failed: {e}") from None
        got = snapshot()
        if got == expected and (after is None or after(k)):
            row.converged += 1
        else:
            if isinstance(got, dict):
                diff = sorted(set(got.items()) ^ set(expected.items()))[:4]
            else:  # a snapshot that is not a tree (the backup row: newest manifest, verify's exit code)
                diff = f"got {str(got)[-300:]}, expected {str(expected)[-300:]}"
            row.failures.append(f"k={k}: {diff}")
    record(row)
    assert row.points > 0 and row.converged == row.points, row.failures
    return row


# ---- local disk ---------------------------------------------------------------------------------------


@HDFS
def test_rollback_undo_prune_crash_matrix_local(spark, run, runner, tmp_path):
    n = target_before_last_compaction(run)
    roots = (run.checkpoint, run.output)
    ops = os.path.join(run.base, ".checkpoint-ops")
    original = tree_digest(*roots)

    # the tree an uninterrupted rollback leaves, and a saved copy of that state (with its undo record)
    code, out, err = runner.run(*_rollback_args(run.checkpoint, run, n))
    assert code == 0, err
    rolled = tree_digest(*roots)
    saved = str(tmp_path / "rolled-back")
    shutil.copytree(run.base, saved, symlinks=True)

    def reset_original():
        run.reset()
        shutil.rmtree(ops, ignore_errors=True)

    def reset_rolled():
        shutil.rmtree(run.base)
        shutil.copytree(saved, run.base, symlinks=True)

    sampled = []
    row = matrix(MatrixRow("rollback", "local"), runner, reset_original, _rollback_args(run.checkpoint, run, n),
                 lambda: _recover_rollback(runner, run.checkpoint, run, n), lambda: tree_digest(*roots), rolled)
    # Spark resumes exactly from recovered results at sampled crash points (first, middle, last)
    for k in sorted({row.tried[0], row.tried[len(row.tried) // 2], row.tried[-1]}):
        reset_original()
        assert runner.run(*_rollback_args(run.checkpoint, run, n), kill_at=k)[0] == -9
        _recover_rollback(runner, run.checkpoint, run, n)
        assert finish_and_read(spark, run) == exact(run)
        sampled.append(k)
    row.spark_checked = sampled
    record(MatrixRow("rollback (Spark resumed)", "local", len(sampled), len(sampled), sampled))

    matrix(MatrixRow("undo", "local"), runner, reset_rolled, ["undo", run.checkpoint, "--yes", "--json"],
           lambda: _ok(runner.run("undo", run.checkpoint, "--yes", "--json")), lambda: tree_digest(*roots), original)

    def pruned(k):
        code, _, err = runner.run("undo", run.checkpoint, "--yes", "--json")
        trash = os.path.join(ops, "checkpoint", "trash")
        left = [f for d, _, fs in os.walk(trash) for f in fs]
        return code == 1 and "pruned" in err and not left

    matrix(MatrixRow("prune", "local"), runner, reset_rolled, ["prune", run.checkpoint, "--keep-last", "0", "--yes"],
           lambda: _ok(runner.run("prune", run.checkpoint, "--keep-last", "0", "--yes")), lambda: tree_digest(*roots),
           rolled, after=pruned)
    reset_original()


def _ok(result):
    """Recovery by running the command again: done now, or it had already finished before the kill."""
    code, out, err = result
    assert code == 0 or (code == 1 and "nothing to undo" in err), (out, err)


# ---- the S3 server ----------------------------------------------------------------------------------------


def _listing(s3, bucket: str, prefix: str) -> dict[str, str]:
    """key (below prefix/) -> ETag."""
    out, token = {}, None
    while True:
        kw = {"Bucket": bucket, "Prefix": prefix + "/", **({"ContinuationToken": token} if token else {})}
        resp = s3.list_objects_v2(**kw)
        for o in resp.get("Contents", []):
            out[o["Key"][len(prefix) + 1:]] = o["ETag"]
        if not resp.get("IsTruncated"):
            return out
        token = resp["NextContinuationToken"]


def _copy_prefix(s3, bucket: str, src: str, dst: str, want: dict | None = None) -> None:
    """Make ``dst/`` an exact copy of ``src/`` (whose listing ``want`` may be given), changing only what
    differs: an operation touches a few of the objects, and each request costs a round trip."""
    have, want = _listing(s3, bucket, dst), want if want is not None else _listing(s3, bucket, src)
    extra = [f"{dst}/{k}" for k in have if k not in want]
    for i in range(0, len(extra), 1000):
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in extra[i:i + 1000]], "Quiet": True})
    todo = [k for k, etag in want.items() if have.get(k) != etag]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: s3.copy_object(Bucket=bucket, Key=f"{dst}/{k}",
                                               CopySource={"Bucket": bucket, "Key": f"{src}/{k}"}), todo))


@pytest.fixture(scope="module")
def small_run(spark, tmp_path_factory):
    """A small stateless query's checkpoint (6 batches, one compaction): on the S3 server every crash
    point costs HTTP round trips, and the objects an operation touches, not their kind, set the count."""
    base = str(tmp_path_factory.mktemp("small") / "run")
    write_event_files(os.path.join(base, "input"), 0, 6)
    run_stateless(spark, base)
    shutil.copytree(base, base + ".pristine", symlinks=True)
    return base


def _reset_local(base: str) -> None:
    shutil.rmtree(base)
    shutil.copytree(base + ".pristine", base, symlinks=True)


def _exact_rows(spark, base: str, files: int) -> None:
    rows = sorted(tuple(r) for r in spark.read.parquet(os.path.join(base, "output")).collect())
    assert rows == sorted((e["key"], e["value"]) for i in range(files) for e in event_rows(i))


def test_rollback_undo_prune_crash_matrix_s3(spark, small_run, runner, bucket, s3_server, tmp_path):
    """The checkpoint on the S3 server (unversioned: moves are copies and deletes), its file sink on
    local disk: one operation spans both stores."""
    s3 = boto3.client("s3", endpoint_url=s3_server)
    base = small_run
    _reset_local(base)
    local_ckpt, output = os.path.join(base, "checkpoint"), os.path.join(base, "output")
    last = max(int(x) for x in os.listdir(os.path.join(local_ckpt, "commits")) if x.isdigit())
    n = last - 1
    s3fs.S3FileSystem(endpoint_url=s3_server).put(local_ckpt + "/", f"{bucket}/pristine/ckpt", recursive=True)
    pristine = _listing(s3, bucket, "pristine")
    ckpt = f"s3://{bucket}/work/ckpt"
    args = ["rollback", ckpt, "--to-batch", n, "--sink", output, *INTERVALS, "--yes", "--json"]

    def snapshot():
        return {"s3": _listing(s3, bucket, "work/ckpt"), "local": tree_digest(output)}

    def reset_original():
        _copy_prefix(s3, bucket, "pristine", "work", pristine)
        _reset_local(base)

    def recover_rollback():
        code, out, err = runner.run("rollback", ckpt, "--resume", *INTERVALS, "--json")
        if code == 1 and ("nothing to resume" in err or "stopped before changing anything" in err):
            code, out, err = runner.run(*args)
        assert code == 0, (out, err)

    reset_original()
    original = snapshot()
    code, out, err = runner.run(*args)
    assert code == 0, err
    rolled = snapshot()
    _copy_prefix(s3, bucket, "work", "saved")
    saved = _listing(s3, bucket, "saved")
    saved_local = str(tmp_path / "rolled-back-local")
    shutil.copytree(base, saved_local, symlinks=True)

    def reset_rolled():
        _copy_prefix(s3, bucket, "saved", "work", saved)
        shutil.rmtree(base)
        shutil.copytree(saved_local, base, symlinks=True)

    row = matrix(MatrixRow("rollback", "s3 + local sink"), runner, reset_original, args, recover_rollback,
                 snapshot, rolled)
    # Spark resumes exactly from a recovered result (copied down: Spark cannot write s3a:// here)
    reset_original()
    k = row.tried[len(row.tried) // 2]
    assert runner.run(*args, kill_at=k)[0] == -9
    recover_rollback()
    shutil.rmtree(local_ckpt)
    s3fs.S3FileSystem(endpoint_url=s3_server, skip_instance_cache=True).get(f"{bucket}/work/ckpt/", local_ckpt + "/",
                                                                            recursive=True)
    run_stateless(spark, base)
    _exact_rows(spark, base, 6)
    record(MatrixRow("rollback (Spark resumed)", "s3 + local sink", 1, 1, [k]))

    matrix(MatrixRow("undo", "s3 + local sink"), runner, reset_rolled, ["undo", ckpt, "--yes", "--json"],
           lambda: _ok(runner.run("undo", ckpt, "--yes", "--json")), snapshot, original)

    def pruned(k):
        code, _, err = runner.run("undo", ckpt, "--yes", "--json")
        return code == 1 and "pruned" in err and not [key for key in _listing(s3, bucket, "work/.checkpoint-ops/ckpt")
                                                      if "/trash/" in "/" + key]

    matrix(MatrixRow("prune", "s3 + local sink"), runner, reset_rolled, ["prune", ckpt, "--keep-last", "0", "--yes"],
           lambda: _ok(runner.run("prune", ckpt, "--keep-last", "0", "--yes")), snapshot, rolled, after=pruned)
    _reset_local(base)


# ---- the sink operations (local disk) -----------------------------------------------------------------------


def test_sink_operations_crash_matrix_local(spark, sink_run, runner):
    """sink compact, retain (deleting files) and orphan cleanup, killed at every mutating call (the
    ledger sync they start with included), then resumed or run again: the output converges to what an
    uninterrupted run leaves, and Spark's readers see exactly the expected rows."""
    base = sink_run
    out, ckpt = f"{base}/output", f"{base}/checkpoint"
    S = ("--sink-compact-interval", str(COMPACT_INTERVAL))
    orphan = f"{out}/part-00000-00000000-0000-0000-0000-00000000dead-c000.snappy.parquet"

    def reset():
        _reset_local(base)
        parts = sorted(f for f in os.listdir(out) if f.endswith(".parquet"))
        shutil.copy(f"{out}/{parts[0]}", orphan)
        for d, _, names in os.walk(out):  # the query stopped an hour ago (there is no checkpoint to ask)
            for n in names:
                os.utime(os.path.join(d, n), (time.time() - 3600, time.time() - 3600))

    ops = {
        "sink compact": (["sink", "compact", out, "--checkpoint", ckpt, *S, "--yes"], ckpt),
        "sink retain --delete-files": (["sink", "retain", out, "--checkpoint", ckpt, "--keep-after-batch", 9,
                                        "--delete-files", *S, "--yes"], ckpt),
        "sink orphans --delete": (["sink", "orphans", out, "--min-age", "10m", "--delete", *S, "--yes"], out),
    }
    for name, (args, anchor) in ops.items():
        reset()
        code, o, err = runner.run(*args)
        assert code == 0, err
        done = tree_digest(out)
        expected_rows = sorted(tuple(r) for r in spark.read.parquet(out).collect())

        def recover(args=args, anchor=anchor):
            code, o, err = runner.run("resume", anchor, "--json")
            if code == 1 and ("nothing to resume" in err or "stopped before changing anything" in err):
                if "completed" not in err:
                    code, o, err = runner.run(*args)
            assert code in (0, 1), (o, err)

        matrix(MatrixRow(name, "local"), runner, reset, args, recover, lambda: tree_digest(out), done)
        assert sorted(tuple(r) for r in spark.read.parquet(out).collect()) == expected_rows
    _reset_local(base)


# ---- backup, restore and backup prune (local disk) -----------------------------------------------------


def _manifest_contents(dest: str) -> list:
    """What each backup holds, oldest first: (root, rel, sha) of every file (ids and times differ)."""
    out = []
    mdir = os.path.join(dest, "manifests")
    for name in sorted(os.listdir(mdir)) if os.path.isdir(mdir) else []:
        if name.endswith(".json"):
            doc = json.load(open(os.path.join(mdir, name)))
            out.append(sorted((rid, f[0], f[1]) for rid, r in doc["roots"].items() for f in r["files"]))
    return out


def test_backup_restore_prune_crash_matrix_local(spark, small_run, runner, tmp_path):
    base = small_run
    _reset_local(base)
    ckpt, out = f"{base}/checkpoint", f"{base}/output"
    I = ("--source-compact-interval", str(COMPACT_INTERVAL), "--sink-compact-interval", str(COMPACT_INTERVAL))
    dest = str(tmp_path / "dest")
    create = ["backup", "create", ckpt, dest, "--sink", out, *I, "--json"]

    # create: killed at every k, then run again; the newest backup holds what an uninterrupted one does
    def newest_after_recovery():
        code, o, err = runner.run(*create)
        assert code == 0, err
        contents = _manifest_contents(dest)
        code, o, err = runner.run("backup", "verify", dest, "--json")
        return (contents[-1] if contents else None, code)

    shutil.rmtree(dest, ignore_errors=True)
    assert runner.run(*create)[0] == 0
    full = _manifest_contents(dest)[-1]
    matrix(MatrixRow("backup create", "local"), runner, lambda: shutil.rmtree(dest, ignore_errors=True), create,
           lambda: None, newest_after_recovery, (full, 0))

    # restore: killed at every k, then resumed (or, if it stopped before changing anything, run again)
    shutil.rmtree(dest, ignore_errors=True)
    code, o, err = runner.run(*create)
    backup_id = json.loads(o)["backup_id"]
    target = tmp_path / "restored"
    restore = ["backup", "restore", dest, backup_id, target / "ckpt", "--sink-target", target / "out",
               "--relocate", f"{base}/input={target}/in", "--yes", "--json"]

    def recover_restore():
        code, o, err = runner.run("resume", target / "ckpt", "--json")
        if code != 0 and "completed" not in err and ("nothing to resume" in err or "no such checkpoint" in err
                                                     or "stopped before changing anything" in err):
            code, o, err = runner.run(*restore)
        assert code == 0 or "completed" in err, (o, err)

    shutil.rmtree(target, ignore_errors=True)
    assert runner.run(*restore)[0] == 0
    restored = tree_digest(target / "ckpt", target / "out")
    matrix(MatrixRow("backup restore", "local"), runner, lambda: shutil.rmtree(target, ignore_errors=True), restore,
           recover_restore, lambda: tree_digest(target / "ckpt", target / "out"), restored)
    rows = sorted(tuple(r) for r in spark.read.parquet(str(target / "out")).collect())
    assert rows == sorted(tuple(r) for r in spark.read.parquet(out).collect())

    # backup prune: killed at every k, then run again; the same backups and objects remain
    shutil.rmtree(dest, ignore_errors=True)
    for _ in range(3):
        assert runner.run(*create)[0] == 0
    saved = str(tmp_path / "dest-saved")
    shutil.copytree(dest, saved)
    prune = ["backup", "prune", dest, "--keep-last", "1", "--yes", "--json"]

    def reset_dest():
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(saved, dest)

    def dest_state():
        objs = sorted(os.listdir(os.path.join(dest, "objects", d)) for d in os.listdir(os.path.join(dest, "objects")))
        return (_manifest_contents(dest), [o for os_ in objs for o in os_ if not o.startswith(".")],
                runner.run("backup", "verify", dest, "--json")[0])

    reset_dest()
    assert runner.run(*prune)[0] == 0
    pruned = dest_state()
    matrix(MatrixRow("backup prune", "local"), runner, reset_dest, prune, lambda: _ok(runner.run(*prune)), dest_state,
           pruned)
    _reset_local(base)


# ---- restore and its undo, RocksDB with checkpoint format V2 (local disk) -----------------------------------


V2_FILES = 2  # input files (one batch each) and one shuffle partition: few files keep the matrix short
V2_CONF = {"spark.sql.shuffle.partitions": "1"}


@pytest.fixture(scope="module")
def v2_small(spark, tmp_path_factory):
    """A small stateful checkpoint (the windowed count) on RocksDB with checkpoint format V2: SST files with
    unique ids, changelogs and Spark's own CRC32C checksum files, all of which a restore rewrites or copies."""
    run = SparkRun("rocksdb_v2", str(tmp_path_factory.mktemp("v2-small") / "run"))
    write_event_files(run.input, 0, V2_FILES)
    run.progress += run.run_query(spark, conf=V2_CONF)
    run.files = V2_FILES
    time.sleep(0.1)
    shutil.copytree(run.base, run.pristine, symlinks=True)
    return run


def test_restore_and_its_undo_crash_matrix_rocksdb_v2(spark, v2_small, runner, tmp_path):
    """``backup restore`` killed at every mutating call, recovered both ways (``undo TARGET``: the target is
    empty again, no directory left in it; ``resume TARGET``: the complete restore); ``undo`` of a completed
    restore killed at every call, recovered by running it again; Spark resumes exactly from a sampled recovered
    restore."""
    run = v2_small
    run.reset()
    dest = str(tmp_path / "dest")
    code, o, err = runner.run("backup", "create", run.checkpoint, dest, "--sink", run.output, *INTERVALS, "--json")
    assert code == 0, err
    backup_id = json.loads(o)["backup_id"]
    target = str(tmp_path / "target")
    ckpt, out, inp = f"{target}/checkpoint", f"{target}/output", f"{target}/input"
    shutil.copytree(run.input, inp)
    restore = ["backup", "restore", dest, backup_id, ckpt, "--sink-target", out, "--relocate", f"{run.input}={inp}",
               "--yes", "--json"]
    undo = ["undo", ckpt, "--yes", "--json"]

    def reset_empty():
        for d in (ckpt, out, f"{target}/.checkpoint-ops"):
            shutil.rmtree(d, ignore_errors=True)

    def spark_files():
        return content_snapshot(ckpt, out)

    def left_by_undo():
        """What Spark reads, and every directory below the roots: an empty ``state/0/<p>`` refuses its start."""
        dirs = {d: "directory" for top in (ckpt, out) for d, _, _ in os.walk(top) if d != top}
        return {**spark_files(), **dirs}

    def recover_by_resume():
        code, o, err = runner.run("resume", ckpt, "--json")
        if code != 0 and "completed" not in err and ("nothing to resume" in err or "no such checkpoint" in err
                                                     or "stopped before changing anything" in err):
            code, o, err = runner.run(*restore)  # it stopped before changing anything: restore again
        assert code == 0 or "completed" in err, (o, err)

    def recover_by_undo():
        code, o, err = runner.run(*undo)
        nothing = ("nothing to undo", "no such checkpoint", "stopped before changing anything", "not a checkpoint")
        assert code == 0 or (code in (1, 2) and any(s in err for s in nothing)), (o, err)

    reset_empty()
    assert runner.run(*restore)[0] == 0
    restored = tree_digest(ckpt, out)
    assert any(n.endswith(".crc") and not n.startswith(".") for _, _, fs in os.walk(f"{ckpt}/state") for n in fs), \
        "the fixture must have Spark's own checksum files (checkpoint format V2)"
    saved = str(tmp_path / "restored")
    shutil.copytree(target, saved, symlinks=True)

    def reset_restored():
        shutil.rmtree(target)
        shutil.copytree(saved, target, symlinks=True)

    row = matrix(MatrixRow("backup restore, then resume", "rocksdb v2"), runner, reset_empty, restore,
                 recover_by_resume, lambda: tree_digest(ckpt, out), restored)
    # the same crash points, recovered the other way: undo leaves nothing Spark would read in the target
    undone = MatrixRow("backup restore, then undo", "rocksdb v2")
    for k in row.tried:
        reset_empty()
        assert runner.run(*restore, kill_at=k)[0] == -9, k
        undone.points += 1
        recover_by_undo()
        left = left_by_undo()
        if left:
            undone.failures.append(f"k={k}: {sorted(left)[:4]}")
        else:
            undone.converged += 1
    record(undone)
    assert undone.converged == undone.points, undone.failures
    matrix(MatrixRow("undo of a restore", "rocksdb v2"), runner, reset_restored, undo,
           lambda: _ok(runner.run(*undo)), left_by_undo, {})

    # Spark resumes exactly from a recovered restore, at its new location (the original moved away)
    k = row.tried[len(row.tried) // 2]
    reset_empty()
    assert runner.run(*restore, kill_at=k)[0] == -9
    recover_by_resume()
    os.rename(run.base, run.base + ".away")
    try:
        restored_run = SparkRun(run.flavour, target, progress=run.progress, files=run.files)
        assert finish_and_read(spark, restored_run, conf=V2_CONF) == exact(run)
    finally:
        os.rename(run.base + ".away", run.base)
    record(MatrixRow("backup restore (Spark resumed)", "rocksdb v2", 1, 1, [k]))
    run.reset()


# ---- killed while a second one starts ------------------------------------------------------------------------


RACED_KILL_POINTS = (2, 6, 10, 16, 30, 45)  # sampled: leasing, journal, fence, among the changes


def raced_kill_matrix(row: MatrixRow, runners, reset, command, second, recover, state) -> MatrixRow:
    """``command`` killed at each sampled point while ``second`` starts at the same moment: the second is
    refused (exit 1, saying why: the lease, or the interrupted operation to finish first) or waits its turn
    (runs entirely before or after; a restore into a target already restored is bad input, exit 2); after the
    recovery a user would run, the tree is what ``command``
    alone leaves, or what the two leave run one after the other."""
    outcomes = []
    for order in ([command], [second, command], [command, second]):
        reset()
        for cmd in order:
            code, o, err = runners[0].run(*cmd)
            assert code in (0, 1, 2), (cmd, o, err)
        outcomes.append(state())
    for k in RACED_KILL_POINTS:
        for _attempt in range(3):  # the second may win the lease: the first is refused, and nothing is killed
            reset()
            first, other = race(runners, [command, second], kill_at=[k, None])
            if first.code == -9 or first.code == 0:
                break
            assert first.code in (1, 2), (k, first.out, first.err)
        if first.code != -9:
            continue  # it finished before its k-th call, or lost the lease every time: no crash point here
        row.points += 1
        assert other.code in (0, 1, 2), f"k={k}: the second command failed: {other.out} {other.err}"
        if other.code != 0:
            assert other.error.get("problem") and other.error.get("fix"), (k, other.out)
        try:
            recover()
        except AssertionError as e:
            row.failures.append(f"k={k}: recovery failed: {e}")
            continue
        if state() in outcomes:
            row.converged += 1
        else:
            row.failures.append(f"k={k}: the tree is neither what it alone leaves nor what the two leave in turn")
    record(row)
    assert row.points > 0 and row.converged == row.points, row.failures
    return row


@pytest.fixture
def runner_pair():
    pair = [ForkRunner(), ForkRunner()]
    yield pair
    for r in pair:
        r.close()


@HDFS
def test_killed_while_a_second_one_starts_local(spark, run, sink_run, runner_pair, tmp_path):  # noqa: F811
    """rollback, undo, prune, sink compact and backup restore, each killed at sampled points while a second
    mutating command starts on the same roots."""
    runner = runner_pair[0]
    roots = (run.checkpoint, run.output)
    n = target_before_last_compaction(run)
    ops = os.path.join(run.base, ".checkpoint-ops")

    def state():
        return content_snapshot(*roots)

    def reset_original():
        run.reset()
        shutil.rmtree(ops, ignore_errors=True)

    reset_original()
    assert runner.run(*_rollback_args(run.checkpoint, run, n))[0] == 0
    saved = str(tmp_path / "rolled-back")
    shutil.copytree(run.base, saved, symlinks=True)

    def reset_rolled():
        shutil.rmtree(run.base)
        shutil.copytree(saved, run.base, symlinks=True)

    undo = ["undo", run.checkpoint, "--yes", "--json"]
    prune = ["prune", run.checkpoint, "--keep-last", "0", "--yes", "--json"]
    raced_kill_matrix(MatrixRow("rollback, raced by a rollback", "local"), runner_pair, reset_original,
                      _rollback_args(run.checkpoint, run, n), _rollback_args(run.checkpoint, run, n + 1),
                      lambda: _recover_rollback(runner, run.checkpoint, run, n), state)
    raced_kill_matrix(MatrixRow("undo, raced by a rollback", "local"), runner_pair, reset_rolled, undo,
                      _rollback_args(run.checkpoint, run, n - 1), lambda: _ok(runner.run(*undo)), state)
    raced_kill_matrix(MatrixRow("prune, raced by an undo", "local"), runner_pair, reset_rolled, prune, undo,
                      lambda: _ok(runner.run(*prune)), state)

    # backup restore, raced by the same restore into the same target
    dest = str(tmp_path / "dest")
    code, o, err = runner.run("backup", "create", run.checkpoint, dest, "--sink", run.output, *INTERVALS, "--json")
    assert code == 0, err
    target = str(tmp_path / "target")
    tckpt, tout = f"{target}/checkpoint", f"{target}/output"
    restore = ["backup", "restore", dest, json.loads(o)["backup_id"], tckpt, "--sink-target", tout, "--relocate",
               f"{run.input}={target}/input", "--yes", "--json"]

    def recover_restore():
        code, o, err = runner.run("resume", tckpt, "--json")
        if code != 0 and "completed" not in err and ("nothing to resume" in err or "no such checkpoint" in err
                                                     or "stopped before changing anything" in err):
            code, o, err = runner.run(*restore)
        assert code == 0 or "completed" in err or "not empty" in err, (o, err)

    raced_kill_matrix(MatrixRow("backup restore, raced by a restore into its target", "local"), runner_pair,
                      lambda: shutil.rmtree(target, ignore_errors=True), restore, restore, recover_restore,
                      lambda: content_snapshot(tckpt, tout))
    reset_original()

    # sink compact (with its checkpoint), raced by a rollback of that checkpoint and sink
    base = sink_run
    ckpt, out = f"{base}/checkpoint", f"{base}/output"
    compact = ["sink", "compact", out, "--checkpoint", ckpt, "--sink-compact-interval", str(COMPACT_INTERVAL), "--yes",
               "--json"]
    last = max(int(x) for x in os.listdir(f"{base}.pristine/checkpoint/commits") if x.isdigit())
    rollback = ["rollback", ckpt, "--to-batch", (last + 1) // COMPACT_INTERVAL * COMPACT_INTERVAL - 3, "--sink", out,
                *INTERVALS, "--yes", "--json"]

    def reset_sink():
        _reset_local(base)
        hour_ago = time.time() - 3600
        for d, _, names in os.walk(out):
            for name in names:
                os.utime(os.path.join(d, name), (hour_ago, hour_ago))

    def recover_compact():  # finish it; if it had changed nothing yet (or the rollback ran last), run it again
        code, o, err = runner.run("resume", ckpt, "--json")
        if code == 1 and ("nothing to resume" in err or "stopped before changing anything" in err):
            code, o, err = runner.run(*compact)
        assert code == 0, (o, err)

    raced_kill_matrix(MatrixRow("sink compact, raced by a rollback", "local"), runner_pair, reset_sink, compact,
                      rollback, recover_compact, lambda: content_snapshot(ckpt, out))
    _reset_local(base)
