"""A rollback never silently leaves out a file sink the checkpoint's records name (recorded_sinks.py).

Spark writes a stateless query's checkpoint and file sink (24 batches, compaction every 5, Spark cleaning
up its own logs) and ``ledger sync --sink`` records the pairing, as the Dagster asset does after every run.
Rolling the checkpoint back alone would leave the sink log with the rolled-back batch ids, and Spark's file
sink skips batch ids its log has: the reprocessed rows would be silently dropped. Spark is the judge: the
query restarts with changed logic (values x 1000 from the first re-run batch), so its output shows whether
each re-run batch's rows were written once, with the new logic, or dropped.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from checkpoint_ops.errors import RefusedError
from checkpoint_ops.operation import RunOptions
from checkpoint_ops.operation import run as run_operation
from checkpoint_ops.recovery import NOTHING, UndoOperation
from pipelines.event_counts import event_rows
from tests.crash import ForkRunner, tree_digest
from tests.helpers import cli, cli_json, content_snapshot, tree_snapshot
from tests.spark_runs import COMPACT_INTERVAL, SESSION_CONF
from tests.test_sink_spark import SINK, Run, rows, sink_run  # noqa: F401  (a fixture)

INTERVALS = ("--source-compact-interval", str(COMPACT_INTERVAL), *SINK)
SCALE = 1000


def _run_changed(spark, run: Run) -> None:
    """The stateless query of ``spark_runs.build_stateless_query`` with its values scaled (a fixed bug)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    for k, v in SESSION_CONF.items():
        if k.startswith("spark.sql."):
            spark.conf.set(k, v)
    schema = T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.LongType()),
                           T.StructField("ts", T.StringType())])
    df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(f"{run.base}/input")
    q = (df.select("key", (F.col("value") * SCALE).alias("value")).writeStream.format("parquet")
         .option("checkpointLocation", run.ckpt).trigger(availableNow=True).start(run.out))
    q.awaitTermination()


def _expected(files: int, rerun_from: int) -> list:
    """Every input file's rows exactly once: as first written up to the target, with the new logic after."""
    return sorted((e["key"], e["value"] * (SCALE if i >= rerun_from else 1))
                  for i in range(files) for e in event_rows(i))


def _files(run: Run) -> int:
    return len([n for n in os.listdir(f"{run.base}/input") if n.endswith(".json")])


def test_rollback_without_a_recorded_sink_is_refused_and_with_it_spark_reprocesses_exactly(spark, sink_run):
    run = Run(sink_run)
    last = run.batches() - 1
    n = last - 6  # crosses the sink log's newest compaction
    before = tree_snapshot(run.base)  # checkpoint, output, input and the ledger and journals beside them
    code, f = cli_json("fsck", run.ckpt, *INTERVALS)
    assert (code, f["findings"]) == (0, []), f

    for extra in ((), ("--dry-run",), ("--yes",)):
        code, out, err = cli("rollback", run.ckpt, "--to-batch", n, *INTERVALS, *extra, "--json")
        assert code == 1, (extra, out, err)
        assert f"records that this checkpoint's query writes the file sink {run.out}" in err, err
        assert f"batches {n + 1}..{last}" in err and "silently dropping their rows" in err, err
        assert f"--to-batch {n} --sink {run.out}" in err and "--without-recorded-sinks" in err, err
        assert [s["url"] for s in json.loads(out)["recorded_sinks"]] == [run.out]
        assert tree_snapshot(run.base) == before, f"a refused rollback ({extra}) changed something"

    code, r = cli_json("rollback", run.ckpt, "--to-batch", n, "--sink", run.out, *INTERVALS, "--yes")
    assert code == 0, r
    assert r["plan"]["roots"] == {"checkpoint": run.ckpt, "sink0": run.out}
    _run_changed(spark, run)
    assert rows(spark, run.out) == _expected(_files(run), n + 1)


def test_without_recorded_sinks_applies_fsck_names_the_sink_and_spark_drops_the_reprocessed_rows(spark, sink_run):
    """The opt-out does what it says (the checkpoint alone), the plan and plain ``fsck`` say what it costs, and
    Spark shows that cost is real: the re-run batches' new rows never reach the sink."""
    run = Run(sink_run)
    last = run.batches() - 1
    n = last - 6
    code, r = cli_json("rollback", run.ckpt, "--to-batch", n, "--without-recorded-sinks", *INTERVALS, "--yes")
    assert code == 0, r
    assert r["plan"]["roots"] == {"checkpoint": run.ckpt}
    assert any(run.out in w and f"batches {n + 1}..{last}" in w for w in r["plan"]["warnings"]), r["plan"]["warnings"]
    assert str(last) in os.listdir(f"{run.out}/_spark_metadata")  # the sink was left as it was

    code, f = cli_json("fsck", run.ckpt, *INTERVALS)  # no --sink: the ledger's record names it
    ahead = [x for x in f["findings"] if x["code"] == "sink-ahead"]
    assert code == 1 and len(ahead) == 1 and ahead[0]["severity"] == "error", f
    assert ahead[0]["path"] == f"{run.out}/_spark_metadata/{last}" and f"--sink {run.out}" in ahead[0]["fix"], ahead

    _run_changed(spark, run)
    got, files = rows(spark, run.out), _files(run)
    assert got == _expected(files, files), "the re-run batches' rows were written: the file sink skipped nothing?"
    assert got != _expected(files, n + 1)


def test_a_recorded_sink_that_is_gone_is_a_warning_and_does_not_block_a_rollback(sink_run, tmp_path):
    run = Run(sink_run)
    n = run.batches() - 4
    shutil.move(run.out, str(tmp_path / "moved-away"))
    code, f = cli_json("fsck", run.ckpt, *INTERVALS)
    assert code == 1 and [(x["code"], x["severity"], x["path"]) for x in f["findings"]] == [
        ("recorded-sink-missing", "warning", run.out)], f
    assert "nothing there any more" in f["findings"][0]["problem"]
    assert "/ledger/pairing/" in f["findings"][0]["fix"] and "--sink NEW" in f["findings"][0]["fix"]

    before = tree_snapshot(run.ckpt)
    code, r = cli_json("rollback", run.ckpt, "--to-batch", n, *INTERVALS, "--dry-run")
    assert code == 0, r
    assert any(run.out in w and "nothing there any more" in w for w in r["plan"]["warnings"]), r["plan"]["warnings"]
    assert tree_snapshot(run.ckpt) == before


def test_to_time_reaches_the_batches_the_ledger_makes_reachable(sink_run):
    """``--to-time`` picks among the batches a ``--to-batch`` reaches: those Spark keeps and those only the batch
    ledger still has (it found only the first, and refused a time the window shows; hostile review)."""
    run = Run(sink_run)
    kept = sorted(int(n) for n in os.listdir(f"{run.ckpt}/offsets") if n.isdigit())
    target = kept[0] - 5
    code, o = cli_json("offsets", run.ckpt, "--batch", target)
    assert code == 0 and o["recorded_in"] == "ledger", o
    code, r = cli_json("rollback", run.ckpt, "--to-time", o["time"], "--sink", run.out, *INTERVALS, "--dry-run")
    assert code == 0, r
    assert r["plan"]["target_batch"] == target, r["plan"]


def test_a_backup_without_a_recorded_sink_is_refused_and_with_it_or_the_opt_out_it_runs(sink_run, tmp_path):
    """Restored without its output, the copy's query writes an output whose log lacks every earlier batch (Spark
    fails there, or their rows are missing): ``backup create`` refuses as a rollback does, before the destination
    is touched."""
    run = Run(sink_run)
    dest = str(tmp_path / "backups")
    before = tree_snapshot(run.base)
    code, out, err = cli("backup", "create", run.ckpt, dest, *INTERVALS, "--json")
    assert code == 1, (out, err)
    assert f"records that this checkpoint's query writes the file sink {run.out}" in err, err
    assert "not part of this backup" in err and f"batches up to {run.batches() - 1}" in err, err
    assert f"--sink {run.out}`" in err and "--without-recorded-sinks" in err, err
    assert not os.path.exists(dest), "a refused backup created its destination"
    assert tree_snapshot(run.base) == before, "a refused backup changed something"

    code, r = cli_json("backup", "create", run.ckpt, dest, "--sink", run.out, *INTERVALS)
    assert code == 0, r
    code, r = cli_json("backup", "create", run.ckpt, str(tmp_path / "alone"), "--without-recorded-sinks", *INTERVALS)
    assert code == 0, r
    code, m = cli_json("backup", "list", str(tmp_path / "alone"))
    assert code == 0 and len(m["backups"]) == 1, m


# ---- undo: the operation it was started for, or nothing ---------------------------------------------------------


def _history(ckpt: str) -> list[tuple[str, int | None, str]]:
    code, h = cli_json("history", ckpt)
    assert code == 0, h
    return [(e["operation"], e["target_batch"], e["status"]) for e in h["operations"]]


def test_two_undos_started_together_undo_only_the_operation_they_were_started_for(spark, sink_run):
    """Two stacked rollbacks; two undos resolve what to undo before either applies (the library calls a command
    makes, in order: no timing). The first undoes the newer rollback; the second finds it undone under the lease
    and refuses, changing nothing, instead of undoing the older rollback nobody asked it to."""
    run = Run(sink_run)
    last = run.batches() - 1
    late = UndoOperation(run.ckpt)
    assert late.resolve() == NOTHING  # nothing journaled yet
    ops, states = [], []
    for n in (last - 3, last - 5):
        code, r = cli_json("rollback", run.ckpt, "--to-batch", n, "--sink", run.out, *INTERVALS, "--yes")
        assert code == 0, r
        ops.append(r["result"]["op_id"])
        states.append(content_snapshot(run.ckpt, run.out))
    before = tree_snapshot(run.base)
    with pytest.raises(RefusedError) as refused:  # started before any rollback: it undoes none of them
        run_operation(late, RunOptions(yes=True))
    problem = refused.value.problem
    assert "nothing was left to undo when this undo started" in problem and ops[1] in problem, problem
    code, out, err = cli("undo", run.ckpt, "--op", ops[0], "--yes")  # not the newest: undo walks back in order
    assert code == 1 and f"the one to undo now is {ops[1]}" in err, err
    code, out, err = cli("undo", run.ckpt, "--op", "20260101T000000.000000Z-rollback-00000000", "--yes")
    assert code == 2 and "history" in err, err
    assert tree_snapshot(run.base) == before

    first, second = UndoOperation(run.ckpt), UndoOperation(run.ckpt)
    assert first.resolve() == second.resolve() == ops[1]
    result = run_operation(first, RunOptions(yes=True, owner="first undo"))
    assert result.applied and result.outcome.op_id == ops[1]
    assert content_snapshot(run.ckpt, run.out) == states[0]
    after_first = tree_snapshot(run.base)
    with pytest.raises(RefusedError) as refused:
        run_operation(second, RunOptions(yes=True, owner="second undo"))
    problem = refused.value.problem
    assert f"operation {ops[1]} (rollback to batch {last - 5}) was already undone by first undo" in problem, problem
    assert f"the one to undo now is {ops[0]}" in problem, problem
    assert "run `checkpoint-ops undo" in refused.value.fix and "again to see what is newest now" in refused.value.fix
    assert tree_snapshot(run.base) == after_first, "the refused undo changed something"
    assert _history(run.ckpt) == [("rollback", last - 3, "applied"), ("rollback", last - 5, "undone")]
    code, out, err = cli("undo", run.ckpt, "--op", ops[1], "--yes")
    assert code == 1 and "already undone by first undo" in err, err

    # what the first undo left is the first rollback's result: Spark reprocesses from it exactly once
    _run_changed(spark, run)
    assert rows(spark, run.out) == _expected(_files(run), last - 2)


# ---- undo killed between its ledger step and its mark -----------------------------------------------------------


@pytest.fixture(scope="module")
def runner():
    r = ForkRunner()
    yield r
    r.close()


def test_a_sink_log_moved_aside_by_an_interrupted_operation_is_named_with_it(sink_run, runner, tmp_path):
    """An operation of ours killed while it had a sink's log moved aside (an undo does, file by file): fsck and
    inspect with ``--sink`` said "not a file-sink output: pass the path given to start(path)" and nothing of the
    interrupted operation (hostile review). They name it, and what finishes or reverts it."""
    from checkpoint_ops.fence import is_fence

    run = Run(sink_run)
    k = 1
    while True:  # the first call at which a kill leaves the checkpoint fenced
        code, out, err = runner.run("rollback", run.ckpt, "--to-batch", run.batches() - 3, "--sink", run.out,
                                    *INTERVALS, "--yes", kill_at=k)
        assert code == -9, (k, out, err)
        if is_fence(open(f"{run.ckpt}/metadata", "rb").read()):
            break
        run = Run(sink_run)
        k += 1
    shutil.move(run.log, str(tmp_path / "aside"))  # as the killed operation could have left it
    for command in ("fsck", "inspect"):
        code, out, err = cli(command, run.ckpt, "--sink", run.out, *INTERVALS)
        assert code == 2 and "no _spark_metadata/ log here" in err, (command, err)
        assert "fenced by an interrupted rollback" in err and f"checkpoint-ops resume {run.ckpt}" in err, (command, err)
    code, f = cli_json("fsck", run.ckpt, *INTERVALS)  # the sink from the ledger's record: not "gone for good"
    missing = [x for x in f["findings"] if x["code"] == "recorded-sink-missing"]
    assert code == 1 and len(missing) == 1 and "operation-interrupted" in {x["code"] for x in f["findings"]}, f
    assert "interrupted rollback" in missing[0]["problem"] and "pairing/" not in missing[0]["fix"], missing


def test_undo_killed_at_every_call_leaves_the_ledger_whole(sink_run, runner, tmp_path):
    """A rollback's truncation of the batch ledger is undone inside the journaled undo, before the undo is
    marked done: killed at any mutating call (the ledger step and the mark included), `undo` run again leaves
    `ledger show` exactly as before the rollback, and the tree byte for byte."""
    run = Run(sink_run)
    last = run.batches() - 1
    roots = (run.ckpt, run.out)
    code, shown = cli_json("ledger", "show", run.ckpt)
    assert code == 0 and shown["batches"] == {"first": 0, "last": last, "count": last + 1}, shown
    original = tree_digest(*roots)
    code, out, err = runner.run("rollback", run.ckpt, "--to-batch", last - 2, "--sink", run.out, *INTERVALS, "--yes",
                                "--json")
    assert code == 0, err
    op_id = json.loads(out)["result"]["op_id"]
    assert cli_json("ledger", "show", run.ckpt)[1]["batches"]["last"] == last - 2
    saved = str(tmp_path / "rolled-back")
    shutil.copytree(run.base, saved, symlinks=True)
    ops = os.path.join(run.base, ".checkpoint-ops", "checkpoint")

    def truncation_left() -> bool:
        return any(f"-truncate-{op_id}" in n for n in os.listdir(os.path.join(ops, "ledger")))

    k, between = 1, []
    while True:
        shutil.rmtree(run.base)
        shutil.copytree(saved, run.base, symlinks=True)
        code, out, err = runner.run("undo", run.ckpt, "--yes", "--json", kill_at=k)
        if code != -9:
            assert code == 0, (k, out, err)
            assert cli_json("ledger", "show", run.ckpt)[1] == shown and tree_digest(*roots) == original
            break
        undone = os.path.exists(os.path.join(ops, "journal", op_id, "undone"))
        assert not (undone and truncation_left()), f"k={k}: marked undone with the ledger still truncated"
        if not undone and not truncation_left():
            between.append(k)
        code, out, err = runner.run("undo", run.ckpt, "--yes", "--json")
        assert code == 0 or (code == 1 and "nothing to undo" in err), (k, out, err)
        assert cli_json("ledger", "show", run.ckpt)[1] == shown, f"k={k}: the ledger lost batches"
        assert tree_digest(*roots) == original, f"k={k}: the tree is not what it was"
        k += 1
    assert between, "no kill landed between the ledger step and the undone mark"
