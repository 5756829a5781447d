"""The operation layer on checkpoints Spark wrote: the lease (held, dead, lapsed, broken), a user's own
query holding it, recovery paths that end, and the smaller promises of the shared command options."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from checkpoint_ops.lease import LEASE_NAME, acquire
from checkpoint_ops.liveness import Holder
from checkpoint_ops.storage import open_file_manager
from tests.helpers import answer_at_prompt, cli, cli_json, is_lease_file, tree_snapshot
from tests.spark_runs import SESSION_CONF
from tests.test_rollback_spark import (
    FENCED,
    INTERVALS,
    _rollback_subprocess,
    content_snapshot,
    exact,
    finish_and_read,
    rollback,
    target_before_last_compaction,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HDFS = pytest.mark.parametrize("flavour", ["hdfs"])


def without_leases(snapshot: dict) -> dict:
    return {p: v for p, v in snapshot.items() if not is_lease_file(p)}


def _dead_holder_lease(root: str) -> int:
    """A lease taken by a process that is then SIGKILLed (as a killed materialization leaves it)."""
    code = ("import sys, time; from checkpoint_ops.lease import acquire; from checkpoint_ops.storage import "
            "open_file_manager; fm, root = open_file_manager(sys.argv[1]); acquire(fm, root, 'a killed run'); "
            "print('held', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, root], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return proc.pid


# ---- the lease -----------------------------------------------------------------------------------------


@HDFS
def test_a_held_lease_refuses_every_mutating_command_and_shows_in_inspect_and_fsck(run):
    n = target_before_last_compaction(run)
    fm, root = open_file_manager(run.checkpoint)
    lease = acquire(fm, root, "the test's runner")
    try:
        before = without_leases(tree_snapshot(run.checkpoint, run.output))
        for args in (["rollback", run.checkpoint, "--to-batch", n, "--sink", run.output, *INTERVALS, "--yes"],
                     ["undo", run.checkpoint, "--yes"], ["resume", run.checkpoint],
                     ["prune", run.checkpoint, "--keep-last", "0", "--yes"],
                     ["sink", "compact", run.output, "--checkpoint", run.checkpoint, "--yes"]):
            code, r = cli_json(*args)
            assert code == 1, (args, r)
            assert "the test's runner" in r["problem"] and f"pid {os.getpid()}" in r["problem"], r
            assert socket.gethostname() in r["problem"] and "since" in r["problem"]
            assert f"checkpoint-ops lease break {run.checkpoint} --yes" in r["fix"]
        assert without_leases(tree_snapshot(run.checkpoint, run.output)) == before
        code, r = cli_json("inspect", run.checkpoint)
        assert r["lease"]["state"] == "held" and r["lease"]["holder"]["owner"] == "the test's runner"
        code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
        assert code == 0 and f["lease"]["state"] == "held"
        code, s = cli_json("lease", "show", run.checkpoint)
        assert s["state"] == "held" and s["holder"]["pid"] == os.getpid()
    finally:
        lease.release()
    code, s = cli_json("lease", "show", run.checkpoint)
    assert s["state"] == "free" and not os.path.exists(os.path.join(run.checkpoint, LEASE_NAME))


@HDFS
def test_the_lease_of_a_killed_process_is_taken_over_with_a_warning(spark, run):
    """A killed run's lease does not block for hours: its pid is gone on this host, so the next operation
    takes it over, says so, and leaves no lease behind."""
    pid = _dead_holder_lease(run.checkpoint)
    code, r = cli_json("inspect", run.checkpoint)
    assert r["lease"]["state"] == "stale" and f"pid {pid} on this host" in r["lease"]["stale_reason"]
    n = target_before_last_compaction(run)
    code, out, err = cli("rollback", run.checkpoint, "--to-batch", n, "--sink", run.output, *INTERVALS, "--yes")
    assert code == 0, err
    assert "took over the lease" in err and "a killed run" in err and f"pid {pid} on this host) is gone" in err
    assert not [p for p in tree_snapshot(run.checkpoint, run.output) if is_lease_file(p)]
    assert finish_and_read(spark, run) == exact(run)


@HDFS
def test_a_lapsed_heartbeat_from_another_host_is_taken_over(run):
    """A holder on another host that stopped renewing (crashed machine): taken over once its time to live
    has passed since its last heartbeat. (The record is written by hand: a host we do not have.)"""
    old = Holder.me("a run on another host", ttl_s=60, now=time.time() - 3600)
    record = {**old.to_dict(), "host": "another-host.example", "pid": 4242}
    with open(os.path.join(run.checkpoint, LEASE_NAME), "w") as f:
        json.dump(record, f)
    code, out, err = cli("rollback", run.checkpoint, "--to-batch", target_before_last_compaction(run), "--sink",
                         run.output, *INTERVALS, "--dry-run")
    assert code == 0, err
    assert "took over the lease" in err and "another-host.example" in err and "last heartbeat" in err


@HDFS
def test_a_live_lease_is_renewed_past_its_time_to_live(run):
    fm, root = open_file_manager(run.checkpoint)
    lease = acquire(fm, root, "a long run", ttl_s=3)  # renewed every second
    try:
        first = json.load(open(os.path.join(run.checkpoint, LEASE_NAME)))["heartbeat_ms"]
        time.sleep(5)  # longer than the time to live: only the heartbeat keeps it
        lease.check()
        now = json.load(open(os.path.join(run.checkpoint, LEASE_NAME)))
        assert now["heartbeat_ms"] > first and now["token"] == lease.holder.token
        code, r = cli_json("rollback", run.checkpoint, "--to-batch", 1, "--dry-run")
        assert code == 1 and "a long run" in r["problem"]
    finally:
        lease.release()


@HDFS
def test_lease_break_is_journaled_and_never_undone(run):
    n = target_before_last_compaction(run)
    original = content_snapshot(run.checkpoint, run.output)
    code, r = rollback(run, n, "--yes")
    assert code == 0, r
    fm, root = open_file_manager(run.checkpoint)
    # a run hung on another host, renewing still (a live holder on this host is refused: stop it instead)
    now = int(time.time() * 1000)
    hung = Holder("a hung run", "another-host.example", 4242, None, "beef" * 8, now, now, 60.0, "operation")
    fm.write_bytes(os.path.join(root, LEASE_NAME), json.dumps(hung.to_dict()).encode(), overwrite=False)
    code, dry = cli_json("lease", "break", run.checkpoint, "--dry-run")
    # the lease and its Hadoop .crc sidecar
    assert code == 0 and dry["plan"]["counts"]["delete"] == 2 and "looks alive" in dry["plan"]["warnings"][0]
    code, b = cli_json("lease", "break", run.checkpoint, "--plan-hash", dry["plan"]["plan_hash"][:12])
    assert code == 0 and b["result"]["operation"] == "lease-break", b
    assert not [n for n in os.listdir(run.checkpoint) if is_lease_file(n)]
    code, h = cli_json("history", run.checkpoint)
    assert [e["operation"] for e in h["operations"]] == ["rollback", "lease-break"]
    assert h["operations"][1]["undo_record"] == "none"
    # undo skips the break and reverts the rollback; the lease it removed never comes back
    code, u = cli_json("undo", run.checkpoint, "--yes")
    assert code == 0 and u["result"]["operation"] == "rollback", u
    assert not os.path.exists(os.path.join(run.checkpoint, LEASE_NAME))
    assert content_snapshot(run.checkpoint, run.output) == original


# ---- a query started without checkpoint-ops ------------------------------------------------------------


def test_a_users_own_query_holds_the_lease_while_it_is_active(spark, tmp_path):
    """A query idle between triggers (processingTime 75 s) writes nothing the tool could see; wrapped in
    hold_lease_while_active, every command refuses to touch its checkpoint until it stops."""
    from checkpoint_ops.spark import hold_lease_while_active
    from pipelines.event_counts import write_event_files

    base = str(tmp_path / "q")
    inp, out, ckpt = f"{base}/input", f"{base}/output", f"{base}/checkpoint"
    write_event_files(inp, 0, 2)
    for k, v in SESSION_CONF.items():
        if k.startswith("spark.sql."):
            spark.conf.set(k, v)
    from pyspark.sql import types as T

    schema = T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.LongType()),
                           T.StructField("ts", T.StringType())])
    query = (spark.readStream.schema(schema).json(inp).select("key", "value").writeStream.format("parquet")
             .option("checkpointLocation", ckpt).trigger(processingTime="75 seconds").start(out))
    try:
        deadline = time.time() + 120
        while not os.path.exists(f"{ckpt}/commits/0"):
            assert time.time() < deadline, "the first batch did not commit"
            time.sleep(0.2)
        held = hold_lease_while_active(query, ckpt, sinks=[out], poll_s=0.2)
        code, r = cli_json("rollback", ckpt, "--to-batch", 0, "--sink", out, "--dry-run")
        assert code == 1 and "hold_lease_while_active" in r["problem"], r
        code, r = cli_json("sink", "compact", out, "--dry-run")  # the sink's own lease too
        assert code == 1 and "hold_lease_while_active" in r["problem"], r
    finally:
        query.stop()
    held._watch.join(30)  # the watcher saw the query stop and released both leases
    assert not [p for p in tree_snapshot(ckpt, out) if is_lease_file(p)]
    code, r = cli_json("rollback", ckpt, "--to-batch", 0, "--sink", out, "--dry-run")
    assert code == 0, r


@HDFS
def test_the_refusal_for_a_fresh_uncommitted_batch_says_to_stop_the_query(run):
    last = run.last_batch
    os.remove(os.path.join(run.checkpoint, "commits", str(last)))
    os.remove(os.path.join(run.checkpoint, "commits", f".{last}.crc"))
    os.utime(os.path.join(run.checkpoint, "offsets", str(last)))
    code, r = rollback(run, target_before_last_compaction(run), "--dry-run")
    assert code == 1 and "stop the query first" in r["fix"] and "hold_lease_while_active" in r["fix"]
    assert "holds no lease" in r["problem"]


# ---- every recovery path ends ------------------------------------------------------------------------------


@HDFS
def test_a_lost_undo_record_is_said_once_and_changes_nothing(run):
    n = target_before_last_compaction(run)
    code, r = rollback(run, n, "--yes")
    assert code == 0, r
    trash = os.path.join(run.base, ".checkpoint-ops", "checkpoint", "trash", r["result"]["op_id"])
    lost = next(os.path.join(d, f) for d, _, fs in os.walk(trash) for f in fs if not f.endswith(".crc"))
    os.remove(lost)
    before = tree_snapshot(run.checkpoint, run.output)
    code, u = cli_json("undo", run.checkpoint, "--yes")
    assert code == 1 and "undo record" in u["problem"] and "incomplete" in u["problem"]
    assert "consistent as it is" in u["fix"] and "backup" in u["fix"]
    assert tree_snapshot(run.checkpoint, run.output) == before  # nothing changed, nothing fenced
    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    assert code == 0, f


@HDFS
def test_an_interrupted_rollback_with_a_lost_undo_record_rolls_forward(spark, run):
    n = target_before_last_compaction(run)
    proc = _rollback_subprocess(run, n, {"CHECKPOINT_OPS_KILL_AT": str(FENCED + 8)})
    assert proc.returncode == -9
    fence = open(os.path.join(run.checkpoint, "metadata")).read()
    assert f"finish it: checkpoint-ops resume {run.checkpoint}" in fence
    assert f"revert it: checkpoint-ops undo {run.checkpoint}" in fence
    trash = os.path.join(run.base, ".checkpoint-ops", "checkpoint", "trash")
    moved = [os.path.join(d, f) for d, _, fs in os.walk(trash) for f in fs]
    assert moved
    os.remove(moved[0])
    before = without_leases(tree_snapshot(run.checkpoint, run.output))
    code, u = cli_json("undo", run.checkpoint, "--yes")
    assert code == 1 and "incomplete" in u["problem"] and f"checkpoint-ops resume {run.checkpoint}" in u["fix"]
    assert without_leases(tree_snapshot(run.checkpoint, run.output)) == before
    code, r = cli_json("resume", run.checkpoint)
    assert code == 0 and r["result"]["status"] == "applied", r
    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    assert code == 0, f
    assert finish_and_read(spark, run) == exact(run)


@HDFS
def test_an_interrupted_undo_can_be_finished_or_rolled_forward(run):
    n = target_before_last_compaction(run)
    original = content_snapshot(run.checkpoint, run.output)
    code, r = rollback(run, n, "--yes")
    assert code == 0, r
    rolled = content_snapshot(run.checkpoint, run.output)
    env = dict(os.environ, CHECKPOINT_OPS_KILL_AT="14")  # leases, marker, fence, then some files put back
    proc = subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", "undo", run.checkpoint, "--yes"], env=env,
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    fence = open(os.path.join(run.checkpoint, "metadata")).read()
    assert f"finish it: checkpoint-ops undo {run.checkpoint}" in fence
    assert f"revert it: checkpoint-ops resume {run.checkpoint}" in fence
    code, res = cli_json("resume", run.checkpoint)  # back to the rollback's result
    assert code == 0, res
    assert content_snapshot(run.checkpoint, run.output) == rolled
    code, u = cli_json("undo", run.checkpoint, "--yes")  # and undo still works, byte for byte
    assert code == 0, u
    assert content_snapshot(run.checkpoint, run.output) == original


def test_undo_of_a_restore_empties_the_target_on_every_state_store(run, tmp_path):
    dest, target = str(tmp_path / "dest"), tmp_path / "restored"
    code, b = cli_json("backup", "create", run.checkpoint, dest, "--sink", run.output, *INTERVALS)
    assert code == 0, b
    code, r = cli_json("backup", "restore", dest, b["backup_id"], target / "ckpt", "--sink-target", target / "out",
                       "--yes")
    assert code == 0, r
    assert any(n.endswith(".crc") for _, _, fs in os.walk(target / "ckpt" / "state") for n in fs)
    code, u = cli_json("undo", target / "ckpt", "--yes")
    assert code == 0, u
    assert not [f for d in (target / "ckpt", target / "out") for _, _, fs in os.walk(d) for f in fs]


# ---- the shared options --------------------------------------------------------------------------------------


@HDFS
def test_ctrl_d_at_the_prompt_is_a_refusal(run):
    before = without_leases(tree_snapshot(run.checkpoint, run.output))
    code, text = answer_at_prompt(["rollback", run.checkpoint, "--to-batch", target_before_last_compaction(run),
                                   "--sink", run.output, *INTERVALS], b"\x04")  # Ctrl-D
    assert code == 1 and "declined" in text and "Traceback" not in text, text
    assert without_leases(tree_snapshot(run.checkpoint, run.output)) == before


@HDFS
def test_shared_options_behave_the_same_everywhere(run, tmp_path):
    # --json errors are one line off a terminal, like results
    code, out, err = cli("rollback", run.checkpoint, "--to-batch", 10**6, "--json")
    assert code == 1 and len(out.strip().splitlines()) == 1 and json.loads(out)["error"] == "RefusedError"
    # durations need a unit everywhere: a bare number meant days to one command and seconds to another
    code, out, err = cli("prune", run.checkpoint, "--older-than", "7", "--dry-run")
    assert code == 2 and "7d for days or 7s for seconds" in err
    code, out, err = cli("prune", run.checkpoint, "--older-than", "7d", "--dry-run")
    assert code == 0, err
    # inspect of a file says it is a file
    code, out, err = cli("inspect", os.path.join(run.checkpoint, "metadata"))
    assert code == 2 and "is a file" in err
    # --plan-hash works for undo too, and is the confirmation
    n = target_before_last_compaction(run)
    assert rollback(run, n, "--yes")[0] == 0
    code, dry = cli_json("undo", run.checkpoint, "--dry-run")
    assert code == 0 and dry["plan"]["operation"] == "undo" and dry["result"] is None
    code, out, err = cli("undo", run.checkpoint, "--dry-run")
    assert code == 0 and "total: " in out and "None bytes" not in out, out  # sizes it knows, or none
    # the header says what the undo is, not the target of the rollback it reverts as if the undo went there
    assert "(undo)" in out.splitlines()[0] and f"to batch {n}" in out and "undo to batch" not in out, out
    code, out, err = cli("undo", run.checkpoint, "--plan-hash", "abc")
    assert code == 2 and "too short" in err
    # a plan that is not the one reviewed is refused, and not shown as if it were about to apply
    code, out, err = cli("undo", run.checkpoint, "--plan-hash", "0" * 12)
    assert code == 1 and "the plan changed since it was reviewed" in err and "total: " not in out + err, out
    code, u = cli_json("undo", run.checkpoint, "--plan-hash", dry["plan"]["plan_hash"][:16])
    assert code == 0 and u["result"]["status"] == "undone", u
    # sink orphans' refusal names a flag it accepts
    os.utime(os.path.join(run.output, "_spark_metadata", str(run.last_batch)))
    code, out, err = cli("sink", "orphans", run.output, "--min-age", "0s", "--delete", "--yes", *INTERVALS[2:])
    assert code == 1 and "pass --checkpoint" in err
    code, out, err = cli("sink", "orphans", run.output, "--checkpoint", run.checkpoint, "--min-age", "0s",
                         *INTERVALS[2:])
    assert code == 0, err


@HDFS
def test_relocate_takes_hive_style_paths(run, tmp_path):
    dest = str(tmp_path / "dest")
    code, b = cli_json("backup", "create", run.checkpoint, dest, "--sink", run.output, *INTERVALS)
    assert code == 0, b
    hive_in = tmp_path / "date=2026-11-21" / "in"
    shutil.copytree(run.input, hive_in)
    target = tmp_path / "restored"
    code, r = cli_json("backup", "restore", dest, b["backup_id"], target / "ckpt", "--sink-target", target / "out",
                       "--relocate", f"{run.input}={hive_in}", "--dry-run")
    assert code == 0, r
    assert r["plan"]["summary"]["relocate"] == [f"{run.input} -> {hive_in}"]
    # '=' on both sides: split at the '=' between the two paths (this OLD is not where the backup's paths are, and
    # the refusal of a rule that moves nothing names the OLD it read)
    other = tmp_path / "k=v" / "input"
    code, r = cli_json("backup", "restore", dest, b["backup_id"], target / "ckpt", "--sink-target", target / "out",
                       "--relocate", f"{hive_in}={other}", "--dry-run")
    assert code == 2 and "matches no path" in r["problem"] and r["problem"].endswith(f"lies under {hive_in}"), r


def test_lease_show_of_a_missing_path_or_a_file_is_unusable_input(tmp_path):
    """A typo must not read as "lease free", nor a file as a storage error."""
    code, out, err = cli("lease", "show", str(tmp_path / "no-such-checkpoint"))
    assert code == 2 and "nothing at this location" in err and "lease free" not in out, (out, err)
    afile = tmp_path / "metadata"
    afile.write_text("{}")
    code, out, err = cli("lease", "show", str(afile))
    assert code == 2 and "this is a file, not a directory" in err, (out, err)
    assert not os.path.exists(str(afile) + "/.checkpoint-ops.lease")


def test_lease_show_of_a_missing_prefix_or_bucket_on_s3_is_unusable_input(s3_server, bucket):
    """On an object store nothing says a prefix exists: ``lease show s3://no-such-bucket/ckpt`` said "lease free"
    with exit 0 (a hostile review). An empty prefix or a missing bucket is exit 2 now; a checkpoint is free."""
    import boto3

    options = json.dumps({"endpoint_url": s3_server})
    for url in (f"s3://{bucket}/no-such-checkpoint", "s3://no-such-bucket-of-ours/ckpt"):
        code, out, err = cli("lease", "show", url, "--storage-options", options)
        assert code == 2 and "nothing at this location" in err and "lease free" not in out, (url, out, err)
        code, out, err = cli("lease", "break", url, "--yes", "--storage-options", options)  # nor "nothing to break"
        assert code == 2 and "nothing at this location" in err, (url, out, err)
    boto3.client("s3", endpoint_url=s3_server).put_object(Bucket=bucket, Key="ckpt/metadata", Body=b'{"id":"x"}')
    code, out, err = cli("lease", "show", f"s3://{bucket}/ckpt", "--storage-options", options)
    assert code == 0 and "lease free" in out, (out, err)
    code, out, err = cli("lease", "show", f"s3://{bucket}/ckpt/metadata", "--storage-options", options)
    assert code == 2 and "this is an object, not a prefix" in err, (out, err)


def test_interrupts_are_held_only_where_sigint_is_pythons_own_keyboard_interrupt():
    """``interrupts_held`` (around a lease's release) holds a first Ctrl-C back and lets a second one through,
    and puts the handler back. Where SIGINT is ignored (a job started in the background) or handled by the caller (a
    Dagster run), it changes nothing: an ignored SIGINT must not become an interrupt during a release. Real signals,
    sent to this process."""
    from checkpoint_ops.interrupts import interrupts_held

    def interrupt() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # Python runs the handler at its next instruction in the main thread

    previous = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with interrupts_held() as caught:
            interrupt()
        assert caught == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt), interrupts_held():
            interrupt()
            interrupt()  # a second Ctrl-C stops at once
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

        # a cleanup that a Ctrl-C started holds nothing: the person pressed once, and the next press stops at once
        # (a hostile review: a restore's claim release and then its lease release each held one more press)
        with pytest.raises(KeyboardInterrupt):
            try:
                raise KeyboardInterrupt
            finally:
                with interrupts_held() as caught:
                    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        try:
            raise ValueError("a failure, not an interrupt: its cleanup is still held")
        except ValueError:
            with interrupts_held() as caught:
                interrupt()
            assert caught == [signal.SIGINT]

        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with interrupts_held() as caught:
            interrupt()
        assert caught == [] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
