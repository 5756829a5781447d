"""A log entry whose name Spark parses as batch N but is not ``N`` (``offsets/031``, ``commits/+31``,
``sources/0/029.compact``, ``_spark_metadata/031``: a hand rename, a copy tool that pads names).

Spark's ``isBatchFile`` parses the name (Java's ``toLong`` takes a leading zero or ``+``), so it lists the entry as
batch N, then reads batch N only from the file named ``N``. Where that file is missing, the query fails to start
(or, in a sink log, the output's readers fail); where it is there, the misnamed one is a stray Spark never reads.
fsck called all of these healthy (exit 0), and took the misnamed file for batch N's; a rollback went ahead over
them. fsck now names each (``misnamed-batch-file``), and rollback refuses (exit 2, nothing changed) until it is
renamed or moved out as the fix says; then Spark resumes exactly. Spark decides each case below.
"""

from __future__ import annotations

import os
import shutil

import pytest

from checkpoint_ops.compat import check_compat
from checkpoint_ops.errors import BadInputError
from checkpoint_ops.model import Checkpoint
from pipelines.event_counts import counts_writer, flush_files
from tests.helpers import cli_json, tree_snapshot
from tests.test_rollback_spark import INTERVALS, exact, finish_and_read, rollback, target_before_last_compaction


def _newest(directory: str) -> str:
    return max((name for name in os.listdir(directory) if not name.startswith(".")),
               key=lambda name: int(name.split(".")[0]))


def _move(directory: str, name: str, to: str, *, copy: bool = False) -> None:
    """Rename (or copy) ``name`` to ``to`` in ``directory``, its Hadoop sidecar with it."""
    act = shutil.copy2 if copy else os.rename
    act(os.path.join(directory, name), os.path.join(directory, to))
    sidecar = os.path.join(directory, f".{name}.crc")
    if os.path.exists(sidecar):
        act(sidecar, os.path.join(directory, f".{to}.crc"))


# log -> where it is under the run (checkpoint or output)
LOGS = {"offsets": "checkpoint", "commits": "checkpoint", "sources/0": "checkpoint", "_spark_metadata": "output"}


@pytest.mark.parametrize("flavour", ["hdfs"])
@pytest.mark.parametrize("log", sorted(LOGS))
def test_a_newest_log_file_renamed_with_a_leading_zero_is_named_refused_and_spark_agrees(spark, run, log):
    directory = os.path.join(getattr(run, LOGS[log]), log)
    right = _newest(directory)
    wrong = "0" + right
    _move(directory, right, wrong)
    rel, wrong_rel = f"{log}/{right}", f"{log}/{wrong}"
    n = target_before_last_compaction(run)

    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    named = [x for x in f["findings"] if x["code"] == "misnamed-batch-file"]
    assert code == 1 and [x["path"] for x in named] == [os.path.join(directory, wrong)], f
    assert named[0]["severity"] == "error" and f"rename it to {rel}" in named[0]["fix"], named
    before = tree_snapshot(run.checkpoint, run.output)
    code, r = rollback(run, n, "--yes")
    assert code == 2 and r["path"] == os.path.join(directory, wrong) and wrong_rel in r["problem"], r
    assert "nothing was changed" in r["problem"], r
    assert tree_snapshot(run.checkpoint, run.output) == before

    # Spark: where it reads batch N, it looks for the file named N and fails; compat, the judge before a changed
    # query restarts, says so rather than judge the change
    if log == "_spark_metadata":
        with pytest.raises(Exception, match=f"{rel} (does not exist|doesn't exist)"):
            spark.read.parquet(run.output).collect()
    else:
        with pytest.raises(BadInputError, match="no query restarts here until it is put right"):
            check_compat(Checkpoint.open(run.checkpoint), spark, lambda s: counts_writer(s, run.input, run.output)
                         .option("checkpointLocation", run.checkpoint).trigger(availableNow=True))
        with pytest.raises(Exception, match=f"{rel} does not exist"):
            run.run_query(spark)

    _move(directory, wrong, right)  # what the fix says; then fsck is clean and the rollback goes through
    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    assert code == 0, f
    code, r = rollback(run, n, "--yes")
    assert code == 0, r
    assert finish_and_read(spark, run) == exact(run)


@pytest.mark.parametrize("flavour", ["hdfs"])
def test_a_stray_copy_beside_the_file_spark_reads_is_refused_until_moved_out(spark, run, tmp_path):
    """``offsets/+N`` beside ``offsets/N``: Spark reads ``offsets/N`` and resumes exactly; a rollback that took the
    stray for batch N's file (the model kept whichever it listed last) would have left one of the two behind."""
    directory = os.path.join(run.checkpoint, "offsets")
    last = str(run.last_batch)
    _move(directory, last, "+" + last, copy=True)
    n = target_before_last_compaction(run)
    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    named = [x for x in f["findings"] if x["code"] == "misnamed-batch-file"]
    assert code == 1 and [x["path"] for x in named] == [os.path.join(directory, "+" + last)], f
    assert " is there: Spark reads no batch from this one" in named[0]["problem"] and "move offsets/+" in named[0]["fix"], named
    before = tree_snapshot(run.checkpoint, run.output)
    code, r = rollback(run, n, "--yes")
    assert code == 2 and r["path"] == os.path.join(directory, "+" + last), r
    assert tree_snapshot(run.checkpoint, run.output) == before
    assert finish_and_read(spark, run) == exact(run)  # Spark never reads the stray

    shutil.move(os.path.join(directory, "+" + last), str(tmp_path))  # what the fix says
    shutil.move(os.path.join(directory, f".+{last}.crc"), str(tmp_path))
    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    assert code == 0, f
    code, r = rollback(run, n, "--yes")
    assert code == 0, r
    assert finish_and_read(spark, run) == exact(run)


def _state_rename(run, case: str) -> list[tuple[str, str]]:
    """(right, wrong) relative paths renamed under the checkpoint for ``case``."""
    ckpt = run.checkpoint
    if case == "operator directory":
        return [("state/0", "state/00")]
    if case == "partition directory":
        return [("state/0/1", "state/0/01")]
    store = os.path.join(ckpt, "state", "0", "1")
    newest = max((n for n in os.listdir(store) if n.rpartition(".")[2] in ("delta", "snapshot", "zip", "changelog")
                  and not n.startswith(".")),
                 key=lambda n: int(n.split(".")[0].split("_")[0]))
    return [(f"state/0/1/{newest}", f"state/0/1/0{newest}")]


@pytest.mark.parametrize("flavour,case", [("hdfs", "operator directory"), ("hdfs", "partition directory"),
                                          ("hdfs", "newest state file"), ("rocksdb_v2", "newest state file")])
def test_a_state_name_spark_parses_but_does_not_read_is_named_and_refused(spark, run, case):
    """``state/00``, ``state/0/01``, ``state/0/1/032.delta``, ``032_<uuid>.changelog``: the state model took each
    for Spark's (``isdigit``), so fsck called the checkpoint healthy and a rollback applied; Spark then failed
    (CANNOT_READ_DELTA_FILE_NOT_EXISTS, CANNOT_READ_STREAMING_STATE_FILE; a hostile review, with Spark)."""
    renamed = _state_rename(run, case)
    for right, wrong in renamed:
        os.rename(os.path.join(run.checkpoint, right), os.path.join(run.checkpoint, wrong))
    n = target_before_last_compaction(run)
    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    named = [x for x in f["findings"] if x["code"] == "misnamed-state-file"]
    assert code == 1 and [x["path"] for x in named] == [os.path.join(run.checkpoint, w) for _, w in renamed], f
    assert named[0]["severity"] == "error" and f"rename it to {renamed[0][0]}" in named[0]["fix"], named
    before = tree_snapshot(run.checkpoint, run.output)
    code, r = rollback(run, n, "--yes")
    assert code == 2 and r["path"] == os.path.join(run.checkpoint, renamed[0][1]), r
    code, b = cli_json("backup", "create", run.checkpoint, os.path.join(run.base, "..", f"dest-{case[:4]}"),
                       "--sink", run.output)
    assert code == 2 and "nothing was backed up" in b["problem"], b
    assert tree_snapshot(run.checkpoint, run.output) == before
    flush_files(run.input, run.files)  # a batch to run, which loads the state
    with pytest.raises(Exception, match="CANNOT_READ|CANNOT_LOAD|does not exist"):  # read under Spark's own name
        run.run_query(spark)
    run.reset()  # the failed run may have written a batch: start from what Spark wrote, renamed and put back
    for right, wrong in renamed:
        os.rename(os.path.join(run.checkpoint, right), os.path.join(run.checkpoint, wrong))
        os.rename(os.path.join(run.checkpoint, wrong), os.path.join(run.checkpoint, right))
    code, r = rollback(run, n, "--yes")
    assert code == 0, r
    assert finish_and_read(spark, run) == exact(run)
