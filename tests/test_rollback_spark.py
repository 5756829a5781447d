"""Rollback with real Spark: Spark writes, we roll back, Spark resumes, and the output is exact.

"Exact" means the sink, read through Spark's own reader, holds every window of the input exactly
once with the right count and sum: two flush files close every window, so the final aggregate
state is in the sink too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from checkpoint_ops.storage.checksums import hadoop_crc_bytes
from pipelines.event_counts import expected_windows, flush_files, read_output
from tests.helpers import is_lease_file, cli_json, content_snapshot, tree_snapshot
from tests.spark_runs import COMPACT_INTERVAL

INTERVALS = ("--source-compact-interval", str(COMPACT_INTERVAL), "--sink-compact-interval", str(COMPACT_INTERVAL))


def counts_module(run, directory, monkeypatch) -> str:
    """A query module for ``checkpoint-ops compat --query MODULE:counts``: the run's query, in the current
    directory."""
    module = f"streams_{os.getpid()}_{run.flavour}"
    (directory / f"{module}.py").write_text(
        "from pipelines.event_counts import counts_writer\n\n"
        f"def counts(spark):\n    return counts_writer(spark, {run.input!r}, {run.output!r})\n")
    monkeypatch.chdir(directory)
    return module


def target_before_last_compaction(run) -> int:
    """Two batches before the newest compaction, so the rollback crosses it (sink and source logs)."""
    c = (run.last_batch + 1) // COMPACT_INTERVAL * COMPACT_INTERVAL - 1
    return c - 2


def rollback(run, n, *extra):
    return cli_json("rollback", run.checkpoint, "--to-batch", n, "--sink", run.output, *INTERVALS, *extra)


def finish_and_read(spark, run, **query_kw):
    """Let Spark resume (with two flush files) and return what its reader sees in the sink."""
    flush_files(run.input, run.files)
    progress = run.run_query(spark, **query_kw)
    assert progress, "Spark ran no batch"
    return read_output(spark, run.output)


def exact(run, scale_for=lambda i: 1):
    return {k: [v] for k, v in expected_windows(range(run.files), scale_for).items()}


def log_offset_at(run, batch: int) -> int:
    text = open(os.path.join(run.checkpoint, "offsets", str(batch))).read().split("\n")
    return json.loads(text[2])["logOffset"]


def test_rollback_then_resume_is_exactly_once(spark, run):
    n = target_before_last_compaction(run)
    sink_log = os.listdir(os.path.join(run.output, "_spark_metadata"))
    assert f"{n + 2}.compact" in sink_log and "0" not in sink_log, "the fixture must have compacted and cleaned up"
    code, r = rollback(run, n, "--yes")
    assert code == 0, r
    assert r["result"]["status"] == "applied" and r["plan"]["target_batch"] == n
    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    assert (code, f["findings"]) == (0, [])
    code, i = cli_json("inspect", run.checkpoint, *INTERVALS)
    assert i["last_committed_batch"] == n and i["offsets"]["last"] == n
    assert i["state"]["operators"][0]["versions"]["last"] == n + 1
    assert finish_and_read(spark, run) == exact(run)


@pytest.mark.parametrize("flavour", ["hdfs"])
def test_rollback_through_the_generic_rename_strategy(spark, run, monkeypatch):
    """The strategy HDFS gets (fsspec, temp-then-rename), forced on local disk for lack of a cluster:
    undo restores byte for byte, and Spark resumes exactly from the rollback."""
    monkeypatch.setenv("CHECKPOINT_OPS_FILE_MANAGER", "rename")
    n = target_before_last_compaction(run)
    before = content_snapshot(run.checkpoint, run.output)
    code, r = rollback(run, n, "--yes")
    assert code == 0, r
    assert r["result"]["requests"]["checkpoint"].get("delete") is None  # nothing unlinked: moved aside
    # fsspec find: one listing (local-rename: per dir) of the checkpoint, and one of the batch ledger beside it
    # (the sink has no pairing record yet, so whether the ledger pairs the checkpoint with it decides), and
    # one of the ledger's segments to name its truncation after the newest (a writer's clock may be behind), and
    # one of the journals, for earlier operations stopped before they changed anything (executor.settle_unstarted)
    assert r["result"]["requests"]["checkpoint"]["list"] == 4
    code, u = cli_json("undo", run.checkpoint, "--yes")
    assert code == 0, u
    assert content_snapshot(run.checkpoint, run.output) == before
    code, r = rollback(run, n, "--yes")
    assert code == 0, r
    assert finish_and_read(spark, run) == exact(run)


def test_rollback_then_changed_logic_applies_to_later_batches(spark, run):
    n = target_before_last_compaction(run)
    k = log_offset_at(run, n)  # input file i was read at log offset i
    code, r = rollback(run, n, "--yes")
    assert code == 0, r
    got = finish_and_read(spark, run, value_scale=100)
    assert got == exact(run, scale_for=lambda i: 100 if i > k else 1)


def test_naive_rollback_loses_data(spark, run, tmp_path, monkeypatch):
    """Deleting only offsets/ and commits/ above N (what people do by hand) breaks the query: the
    file sink skips the batch ids it already logged. With HDFS and RocksDB state the rows of those
    batches silently vanish; with checkpoint format V2 the skipped batch commits no state ids and
    Spark stops with an assertion. Keep this test: it is why the rollback does what it does.
    ``compat`` says so before Spark runs, with the rollback that cuts the sink as the fix: silently different (the
    state of those batches is still there, so nothing fails), and on V2 fails at restart."""
    n = target_before_last_compaction(run)
    for sub in ("offsets", "commits"):
        for b in range(n + 1, run.last_batch + 1):
            for name in (str(b), f".{b}.crc"):
                os.remove(os.path.join(run.checkpoint, sub, name))
    code, doc = cli_json("compat", run.checkpoint, "--query", f"{counts_module(run, tmp_path, monkeypatch)}:counts")
    [sink] = [d for d in doc["differences"] if d["aspect"] == "sink"]
    verdict = "fails-at-restart" if run.flavour == "rocksdb_v2" else "silently-different"
    assert code == 1 and (sink["verdict"], sink["rollback_to"]) == (verdict, n), sink
    assert f"--to-batch {n} --sink {run.output}" in sink["fix"] and "never reach the output" in sink["effect"], sink
    if run.flavour == "rocksdb_v2":
        with pytest.raises(Exception, match="CheckpointInfo length: 0"):
            finish_and_read(spark, run)
        return
    got = finish_and_read(spark, run)
    expected = exact(run)
    missing = [w for w in expected if w not in got]
    assert missing, "the naive rollback should lose windows"
    assert all(got[w] == expected[w] for w in got), "what is left is not wrong, just incomplete"


def test_undo_restores_byte_for_byte_and_spark_resumes(spark, run):
    n = target_before_last_compaction(run)
    before = content_snapshot(run.checkpoint, run.output)
    code, r = rollback(run, n, "--yes")
    assert code == 0, r
    assert content_snapshot(run.checkpoint, run.output) != before
    code, u = cli_json("undo", run.checkpoint, "--yes")
    assert code == 0, u
    assert u["result"]["status"] == "undone" and u["result"]["op_id"] == r["result"]["op_id"]
    assert content_snapshot(run.checkpoint, run.output) == before
    # the pairing the rollback checked and recorded is as true after the undo: the record stays
    assert os.path.exists(os.path.join(run.output, ".checkpoint-ops.pairing.json"))
    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS, "--deep")
    assert (code, f["findings"]) == (0, [])
    assert finish_and_read(spark, run) == exact(run)


def test_dry_run_prints_the_plan_that_is_applied(run):
    n = target_before_last_compaction(run)
    before = tree_snapshot(run.checkpoint, run.output)
    code, dry = rollback(run, n, "--dry-run")
    assert code == 0 and dry["dry_run"] is True
    assert tree_snapshot(run.checkpoint, run.output) == before, "--dry-run must change nothing"
    h = dry["plan"]["plan_hash"]
    kinds = {a["kind"] for a in dry["plan"]["actions"]}
    assert kinds == {"delete"}
    # every file it will delete exists now, with its reason
    for a in dry["plan"]["actions"]:
        root = run.checkpoint if a["root"] == "checkpoint" else run.output
        assert os.path.exists(os.path.join(root, a["rel"])) and a["reason"]
    code, applied = rollback(run, n, "--yes", "--plan-hash", h[:12])
    assert code == 0
    assert applied["plan"] == dry["plan"]
    assert applied["result"]["plan_hash"] == h
    journal = applied["result"]["journal"]
    assert json.load(open(os.path.join(journal, "plan.json")))["plan"]["plan_hash"] == h


def test_plan_hash_mismatch_is_refused(run):
    n = target_before_last_compaction(run)
    before = tree_snapshot(run.checkpoint, run.output)
    code, r = rollback(run, n, "--yes", "--plan-hash", "deadbeef")
    assert code == 1 and "plan changed" in r["problem"]
    assert tree_snapshot(run.checkpoint, run.output) == before


def test_refusal_outside_the_window_names_the_earliest_batch(run):
    code, i = cli_json("inspect", run.checkpoint, *INTERVALS)
    earliest = i["rollback_window"]["earliest"]
    too_early = i["offsets"]["first"]  # offsets/first-1 is purged: Spark could not restart
    before = tree_snapshot(run.checkpoint, run.output)
    code, r = rollback(run, too_early, "--yes")
    assert code == 1, r
    assert f"offsets/{too_early - 1}" in r["problem"]
    assert f"earliest reachable batch is {earliest}" in r["problem"]
    assert tree_snapshot(run.checkpoint, run.output) == before
    code, r = rollback(run, run.last_batch + 5, "--yes")
    assert code == 1 and "never committed" in r["problem"]


def test_rollback_to_the_earliest_reachable_batch_works(spark, run):
    code, i = cli_json("inspect", run.checkpoint, *INTERVALS)
    earliest = i["rollback_window"]["earliest"]
    code, r = rollback(run, earliest, "--yes")
    assert code == 0, r
    assert finish_and_read(spark, run) == exact(run)


def test_to_time_picks_the_last_batch_planned_before_it(run):
    from datetime import datetime, timezone

    code, i = cli_json("inspect", run.checkpoint, *INTERVALS)
    b = i["batches"][-4]
    after = i["batches"][-3]
    t = datetime.fromtimestamp((b["timestamp_ms"] + after["timestamp_ms"]) / 2000, tz=timezone.utc).isoformat()
    code, dry = cli_json("rollback", run.checkpoint, "--to-time", t, "--sink", run.output, *INTERVALS, "--dry-run")
    assert code == 0 and dry["plan"]["target_batch"] == b["id"]


def test_keep_files_moves_sink_data_aside(spark, run, tmp_path):
    n = target_before_last_compaction(run)
    keep = tmp_path / "kept"
    code, r = rollback(run, n, "--yes", "--keep-files", keep)
    assert code == 0, r
    moved = [a["rel"] for a in r["plan"]["actions"] if a["kind"] == "keep"]
    assert moved and all((keep / rel).exists() for rel in moved)
    assert not any(os.path.exists(os.path.join(run.output, rel)) for rel in moved)
    code, u = cli_json("undo", run.checkpoint, "--yes")
    assert code == 0 and all(os.path.exists(os.path.join(run.output, rel)) for rel in moved)


# Mutating calls of a rollback on local disk (storage/killswitch.py counts them): the leases of the
# checkpoint and of the sink and their .crc (1-4), the journal and its .crc (5, 6), the ledger truncation
# and its .crc (7, 8), the fence over metadata and its .crc (9, 10), then one per file moved aside. The
# crash matrix (test_crash_matrix.py) kills at every one of them.
FENCE_AT = 9
FENCED = FENCE_AT + 2


def _rollback_subprocess(run, n, env_extra):
    env = dict(os.environ, **env_extra)
    cmd = [sys.executable, "-m", "checkpoint_ops.cli", "rollback", run.checkpoint, "--to-batch", str(n),
           "--sink", run.output, *INTERVALS, "--yes", "--json"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))


@pytest.mark.parametrize("kill_at", [FENCED, FENCED + 8, FENCED + 39])
def test_killed_rollback_is_fenced_then_resumed(run, kill_at):
    n = target_before_last_compaction(run)
    code, dry = rollback(run, n, "--dry-run")
    proc = _rollback_subprocess(run, n, {"CHECKPOINT_OPS_KILL_AT": str(kill_at)})
    assert proc.returncode == -9, proc.stderr[-2000:]
    # Spark cannot start from a half-done rollback: metadata is fenced, and fsck says what to do.
    assert open(os.path.join(run.checkpoint, "metadata"), "rb").read().startswith(b"CHECKPOINT-OPS-FENCE")
    code, f = cli_json("fsck", run.checkpoint, *INTERVALS)
    assert "operation-interrupted" in {x["code"] for x in f["findings"]}
    code, r = rollback(run, n, "--yes")
    assert code == 1 and f"checkpoint-ops resume {run.checkpoint}" in r["fix"]
    code, res = cli_json("rollback", run.checkpoint, "--resume", *INTERVALS)
    assert code == 0, res
    assert res["result"]["plan_hash"] == dry["plan"]["plan_hash"]
    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    assert (code, f["findings"]) == (0, [])


def test_killed_rollback_resumed_then_spark_is_exact(spark, run):
    n = target_before_last_compaction(run)
    proc = _rollback_subprocess(run, n, {"CHECKPOINT_OPS_KILL_AT": str(FENCED + 24)})
    assert proc.returncode == -9
    # Spark refuses the fenced checkpoint instead of guessing, reading its metadata (docs/cli.md quotes its error)
    with pytest.raises(Exception, match="Unrecognized token 'CHECKPOINT'"):
        run.run_query(spark)
    code, res = cli_json("rollback", run.checkpoint, "--resume", *INTERVALS)
    assert code == 0, res
    assert finish_and_read(spark, run) == exact(run)


@pytest.mark.parametrize("flavour", ["hdfs"])
def test_a_sink_command_without_the_checkpoint_refuses_an_output_a_killed_rollback_held(spark, run):
    """A rollback killed part-way, then ``sink compact OUTPUT`` without ``--checkpoint`` (the output has no pairing
    record until a rollback is applied): it took the dead rollback's lease over and compacted the log, deleting files
    the rollback still needed; ``resume`` then reported success and Spark failed (BATCH_METADATA_NOT_FOUND; a
    hostile review, with Spark). Now it refuses, naming the rollback and ``resume``, and changes nothing."""
    n = target_before_last_compaction(run)
    an_hour_ago = time.time() - 3600  # a query stopped long ago: no file looks like a running batch
    for top in (run.checkpoint, run.output):
        for parent, _, names in os.walk(top):
            for name in names:
                os.utime(os.path.join(parent, name), (an_hour_ago, an_hour_ago))
    proc = _rollback_subprocess(run, n, {"CHECKPOINT_OPS_KILL_AT": str(FENCED + 24)})
    assert proc.returncode == -9, proc.stderr[-2000:]
    before = tree_snapshot(run.output)
    for command in (["compact"], ["orphans", "--min-age", "0s", "--delete"]):
        code, r = cli_json("sink", command[0], run.output, *INTERVALS[2:], *command[1:], "--yes")
        assert code == 1 and "rollback" in r["problem"] and "checkpoint-ops resume CKPT" in r["fix"], r
        assert tree_snapshot(run.output) == before
    code, res = cli_json("resume", run.checkpoint, "--yes")
    assert code == 0, res
    assert finish_and_read(spark, run) == exact(run)


def test_killed_rollback_can_be_undone_byte_for_byte(run):
    n = target_before_last_compaction(run)
    before = content_snapshot(run.checkpoint, run.output)
    proc = _rollback_subprocess(run, n, {"CHECKPOINT_OPS_KILL_AT": str(FENCED + 29)})
    assert proc.returncode == -9
    code, u = cli_json("undo", run.checkpoint, "--yes")
    assert code == 0, u
    assert content_snapshot(run.checkpoint, run.output) == before


def test_undo_after_spark_ran_is_refused(spark, run):
    n = target_before_last_compaction(run)
    code, r = rollback(run, n, "--yes")
    assert code == 0
    flush_files(run.input, run.files)
    run.run_query(spark)
    before = tree_snapshot(run.checkpoint, run.output)
    code, u = cli_json("undo", run.checkpoint, "--yes")
    assert code == 1 and "mix two timelines" in u["problem"]
    assert tree_snapshot(run.checkpoint, run.output) == before


def test_rollback_clears_litter_spark_never_reads_and_spark_resumes_exactly(spark, run):
    """Sidecars a killed writer leaves behind: that of a temp file that is gone (Hadoop renames a file,
    then its sidecar: killed in between), and one in an operator's ``_metadata`` folder, outside any
    state store's. fsck reports both; the rollback removes them with the batches after the target, fsck
    then finds nothing, and Spark resumes from what is left with the exact output."""
    n = run.last_batch - 2
    litter = [f"offsets/..{run.last_batch + 1}.0b3c5d6e-aaaa-bbbb-cccc-123456789abc.tmp.crc",
              "state/0/_metadata/.gone.crc"]
    assert os.path.isdir(os.path.join(run.checkpoint, "state", "0", "_metadata"))
    for rel in litter:
        with open(os.path.join(run.checkpoint, rel), "wb") as f:
            f.write(hadoop_crc_bytes(b"gone"))
    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    assert sorted(x["path"] for x in f["findings"] if x["code"] == "orphan-crc") == sorted(
        os.path.join(run.checkpoint, rel) for rel in litter), f["findings"]
    code, r = rollback(run, n, "--yes")
    assert code == 0, r
    assert set(litter) <= {a["rel"] for a in r["plan"]["actions"] if a["kind"] == "delete" and a["phase"] == "litter"}
    assert not [rel for rel in litter if os.path.exists(os.path.join(run.checkpoint, rel))]
    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    assert (code, f["findings"]) == (0, [])
    assert finish_and_read(spark, run) == exact(run)


def test_undo_of_a_cleanup_after_spark_ran_is_refused(spark, run):
    """A rollback to the last batch deletes no log file (only litter); if the query then runs, its
    new batches must still block undo."""
    tmp = os.path.join(run.checkpoint, "offsets", ".99.0b3c5d6e-aaaa-bbbb-cccc-123456789abc.tmp")
    open(tmp, "wb").write(b"x")
    code, r = rollback(run, run.last_batch, "--yes")
    assert code == 0 and r["plan"]["counts"]["delete"] == 1
    flush_files(run.input, run.files)
    run.run_query(spark)
    code, u = cli_json("undo", run.checkpoint, "--yes")
    assert code == 1 and "mix two timelines" in u["problem"]


def test_active_query_is_refused_unless_forced(run):
    from checkpoint_ops.lease import acquire
    from checkpoint_ops.storage import open_file_manager

    n = target_before_last_compaction(run)
    fm, root = open_file_manager(run.checkpoint)
    lease = acquire(fm, root, "test-runner")
    try:
        code, r = rollback(run, n, "--dry-run")
        assert code == 1 and "test-runner" in r["problem"] and "lease break" in r["fix"]
        code, r = rollback(run, n, "--dry-run", "--force")  # --force never overrides a lease
        assert code == 1 and "test-runner" in r["problem"]
    finally:
        lease.release()
    # an uncommitted batch planned moments ago also means "running"
    last = run.last_batch
    os.remove(os.path.join(run.checkpoint, "commits", str(last)))
    os.remove(os.path.join(run.checkpoint, "commits", f".{last}.crc"))
    os.utime(os.path.join(run.checkpoint, "offsets", str(last)))
    code, r = rollback(run, n, "--dry-run")
    assert code == 1 and f"offsets/{last} has no commit" in r["problem"]


def test_refuses_without_confirmation_off_a_terminal(run):
    n = target_before_last_compaction(run)
    before = tree_snapshot(run.checkpoint, run.output)
    code, r = rollback(run, n)  # stdin is not a TTY under pytest
    assert code == 1 and "--yes" in r["fix"]
    assert tree_snapshot(run.checkpoint, run.output) == before



def test_journal_written_but_never_fenced_is_abandoned_not_resumed(run):
    """A crash between writing the journal and fencing changed nothing; Spark may have run since,
    so resuming the old plan could mix timelines: it is dropped instead."""
    n = target_before_last_compaction(run)
    proc = _rollback_subprocess(run, n, {"CHECKPOINT_OPS_KILL_AT": str(FENCE_AT)})  # killed before the fence
    assert proc.returncode == -9
    assert not open(os.path.join(run.checkpoint, "metadata"), "rb").read().startswith(b"CHECKPOINT-OPS")
    before = tree_snapshot(run.checkpoint, run.output)
    # the fence's temp file, written before the kill landed on its publication
    ours = [p for p in before if os.path.basename(p).startswith(".metadata.") and p.endswith(".tmp")]
    assert len(ours) == 1, ours
    # the killed process's leases (checkpoint and sink): stale at once, its pid is gone
    dead_leases = [p for p in before if is_lease_file(p)]
    assert len(dead_leases) == 4, dead_leases
    code, r = cli_json("rollback", run.checkpoint, "--resume", *INTERVALS)
    assert code == 1 and "stopped before changing anything" in r["problem"]
    assert tree_snapshot(run.checkpoint, run.output) == {p: v for p, v in before.items()
                                                         if p not in ours + dead_leases}
    code, r = rollback(run, n, "--yes")  # planning again works
    assert code == 0, r


NO_MAINTENANCE = {"spark.sql.streaming.stateStore.maintenanceInterval": "600s"}


def _reprocess_with_restart_at_version(spark, run, n, k, version, **query_kw):
    """Re-run batches n+1.. in two query runs, restarting so that the second run's first batch loads
    state ``version`` (or one above, if Spark adds a no-data batch) from disk: a fresh run has no
    cached state. Maintenance is off, so no new snapshot hides the old ones."""
    inp = run.input
    later = [f for f in sorted(os.listdir(inp)) if f.startswith("events-") and int(f[7:12]) > k + (version - 1 - n)]
    parked = inp + ".parked"
    os.makedirs(parked)
    for f in later:
        os.rename(os.path.join(inp, f), os.path.join(parked, f))
    run.run_query(spark, conf=NO_MAINTENANCE, **query_kw)  # batches n+1 .. version-1: state up to `version`
    for f in later:
        os.rename(os.path.join(parked, f), os.path.join(inp, f))
    os.rmdir(parked)
    return finish_and_read(spark, run, conf=NO_MAINTENANCE, **query_kw)


def _newest_snapshot(run):
    """Where maintenance wrote snapshots depends on timing, so the test picks its target from them."""
    d = os.path.join(run.checkpoint, "state", "0", "0")
    snaps = sorted(int(x.split(".")[0]) for x in os.listdir(d) if x.endswith(".snapshot") and x[0] != ".")
    assert snaps, f"the fixture has no state snapshot in {d}"
    return snaps[-1]


@pytest.mark.parametrize("stale_state_left", [True, False], ids=["stale-state-left", "state-cleaned"])
def test_reprocessing_across_a_restart_needs_stale_state_gone(spark, spark_runs, stale_state_left):
    """Why rollback deletes state above N+1 (HDFS). Reprocess with changed logic and restart midway:
    if the old timeline's higher snapshots are still there (as a naive rollback leaves them), the
    restarted run loads one and the results are silently wrong; with them gone, they are exact."""
    run = spark_runs("hdfs")
    run.reset()
    s = _newest_snapshot(run)
    n = s - 3  # state version n+1 is kept; snapshot s (> n+2) belongs to the old timeline
    earliest = min(int(f) for f in os.listdir(os.path.join(run.checkpoint, "commits")) if f.isdigit())
    assert n >= earliest + 2, f"the newest snapshot ({s}) is too old for a rollback window starting at {earliest}"
    k = log_offset_at(run, n)
    code, r = rollback(run, n, "--yes")
    assert code == 0, r
    if stale_state_left:
        trash = os.path.join(run.base, ".checkpoint-ops", "checkpoint", "trash", r["result"]["op_id"])
        for rel in (a["rel"] for a in r["plan"]["actions"] if a["phase"] == "state"):
            os.rename(os.path.join(trash, rel), os.path.join(run.checkpoint, rel))
    got = _reprocess_with_restart_at_version(spark, run, n, k, s, value_scale=100)
    expected = exact(run, scale_for=lambda i: 100 if i > k else 1)
    if stale_state_left:
        assert got != expected
        assert all(len(v) == 1 for v in got.values()), "no duplicates: the damage is in the values"
    else:
        assert got == expected
    run.reset()


REFUSAL_WITHOUT_OFFSETS = {"hdfs": "CONCURRENT_STREAM_LOG_UPDATE", "rocksdb_v2": "CheckpointInfo length: 0"}


@pytest.mark.parametrize("flavour", sorted(REFUSAL_WITHOUT_OFFSETS))
def test_a_torn_offsets_file_of_a_committed_batch_is_repaired_as_fsck_says(spark, spark_runs, flavour):
    """A crash on a store without atomic renames can leave ``offsets/N`` empty although batch N committed.
    fsck's fix (``logfile.TORN_LOG_FIX``) says to roll back to the batch before it, not to delete the file:
    deleting it leaves a commit without its offsets, which Spark refuses (shown: with HDFS state as a concurrent
    update of the log, with RocksDB's format V2 for want of the batch's state ids), and after the rollback Spark
    resumes exactly."""
    run = spark_runs(flavour)
    run.reset()
    try:
        n = run.last_batch
        assert os.path.exists(os.path.join(run.checkpoint, "commits", str(n)))
        with open(os.path.join(run.checkpoint, "offsets", str(n)), "wb"):
            pass
        code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
        (torn,) = [x for x in f["findings"] if x["path"].endswith(f"offsets/{n}")]
        assert code == 1 and "empty" in torn["problem"]
        assert "once batch N committed, `checkpoint-ops rollback` to the batch before it" in torn["fix"]

        for name in (str(n), f".{n}.crc"):  # deleting the file alone (what the fix warns against)
            os.remove(os.path.join(run.checkpoint, "offsets", name))
        flush_files(run.input, run.files)
        with pytest.raises(Exception) as refused:
            run.run_query(spark)
        assert REFUSAL_WITHOUT_OFFSETS[flavour] in str(refused.value), refused.value

        run.reset()
        with open(os.path.join(run.checkpoint, "offsets", str(n)), "wb"):
            pass
        code, r = rollback(run, n - 1, "--yes")
        assert code == 0, r
        code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
        assert (code, f["findings"]) == (0, [])
        assert finish_and_read(spark, run) == exact(run)
    finally:
        run.reset()


def test_a_rollback_without_the_sink_is_a_compat_failure_whose_fix_spark_resumes_from(spark, run, tmp_path,
                                                                                      monkeypatch):
    """A rollback without ``--sink`` (a warning) leaves the file sink's log ahead of the checkpoint. Spark's file
    sink then skips the re-run batches its log holds, and the stateful query commits them without their state: on
    HDFS and RocksDB its first new batch cannot load the state, on checkpoint format V2 the skipped batch itself
    stops (CheckpointInfo length: 0). ``compat`` says so (fails at restart) and names the rollback to the
    checkpoint's own batch with the sink, after which Spark resumes with exactly the expected output."""
    n = target_before_last_compaction(run)
    module = counts_module(run, tmp_path, monkeypatch)

    def roll_back_without_the_sink():
        code, r = cli_json("rollback", run.checkpoint, "--to-batch", n, *INTERVALS, "--yes")
        assert code == 0 and any("no file sink given" in w for w in r["plan"]["warnings"]), r

    roll_back_without_the_sink()
    code, doc = cli_json("compat", run.checkpoint, "--query", f"{module}:counts")
    assert code == 1 and doc["batch"] == n, doc
    # no profile is recorded beside these checkpoints: the stateful operators are "check by hand" as well
    [sink] = [d for d in doc["differences"] if d["aspect"] == "sink"]
    assert (sink["aspect"], sink["verdict"], sink["rollback_to"]) == ("sink", "fails-at-restart", n), sink
    v2 = run.flavour == "rocksdb_v2"
    refusal = "CheckpointInfo length: 0" if v2 else "CANNOT_LOAD_STATE_STORE"
    assert refusal in sink["effect"] and sink["error_class"] == (None if v2 else refusal), sink
    command = sink["fix"].split("`")[1]
    assert command == f"checkpoint-ops rollback {run.checkpoint} --to-batch {n} --sink {run.output}", sink
    with pytest.raises(Exception, match=refusal):  # what the verdict claims, from Spark itself
        finish_and_read(spark, run)

    run.reset()
    roll_back_without_the_sink()
    code, r = cli_json(*command.split()[1:], *INTERVALS, "--yes")
    assert code == 0, r
    code, doc = cli_json("compat", run.checkpoint, "--query", f"{module}:counts")
    assert code == 1 and [(d["aspect"], d["verdict"]) for d in doc["differences"]] == \
        [("stateful-operators", "check-by-hand")], doc
    assert finish_and_read(spark, run) == exact(run)
