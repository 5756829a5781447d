"""Two ``undo --yes`` started together revert one operation, not two, even when the first finishes before
the second has even looked (a loaded machine: Python's startup outlasts a whole undo). The command's start
time decides: an undo refuses when another command undid an operation at or after it started, or when the
operation it would act on was journaled after it started. Deterministic: the second command's start time is
given (taken before the first undo runs), never raced with sleeps. Fast tier: synthetic checkpoint, no Spark."""

from __future__ import annotations

import time

import pytest

from benchmarks import synthetic
from checkpoint_ops.errors import RefusedError
from checkpoint_ops.journal import list_journals, load_journal, ops_dir
from checkpoint_ops.model.checkpoint import Checkpoint
from checkpoint_ops.operation import RunOptions, run
from checkpoint_ops.recovery import ResumeOperation, UndoOperation
from tests.helpers import cli_json, content_snapshot
from tests.synthetic_sink import write_sink


@pytest.fixture()
def rolled_twice(tmp_path):
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    synthetic.write_local(ckpt, batches=40, partitions=2, retain_state=45, input_dir=str(tmp_path / "in"))
    write_sink(out, 40, compact_interval=10)
    for batch in ("35", "30"):
        code, doc = cli_json("rollback", ckpt, "--to-batch", batch, "--sink", out, "--yes")
        assert code == 0, doc
    return ckpt, out


def _statuses(ckpt: str) -> list[tuple[str, bool]]:
    c = Checkpoint.open(ckpt)
    return [(load_journal(c.fm, p).record["plan"]["target_batch"], load_journal(c.fm, p).has_marker("undone"))
            for p in list_journals(c.fm, ops_dir(c.fm, c.root))]


def test_an_undo_started_before_another_finished_does_not_revert_a_second_operation(rolled_twice):
    ckpt, out = rolled_twice
    second_started = time.time()  # the second undo starts here; the first one runs to the end before it looks
    code, doc = cli_json("undo", ckpt, "--yes")
    assert code == 0 and doc["result"]["status"] == "undone", doc
    after_first = content_snapshot(ckpt, out)

    with pytest.raises(RefusedError) as e:
        run(UndoOperation(ckpt, started=second_started), RunOptions(yes=True))
    assert "was undone" in e.value.problem and "after this undo started" in e.value.problem, e.value.problem
    assert "to batch 30" in e.value.problem and "to batch 35" in e.value.problem, e.value.problem
    assert "again" in e.value.fix
    assert _statuses(ckpt) == [(35, False), (30, True)]  # one operation reverted, not two
    assert content_snapshot(ckpt, out) == after_first  # nothing changed

    # started afterwards (as a person would, having seen the result), the next undo goes on
    code, doc = cli_json("undo", ckpt, "--yes")
    assert code == 0 and doc["result"]["target_batch"] == 35, doc
    assert _statuses(ckpt) == [(35, True), (30, True)]


def test_an_undo_does_not_revert_an_operation_journaled_after_it_started(tmp_path):
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    synthetic.write_local(ckpt, batches=40, partitions=2, retain_state=45, input_dir=str(tmp_path / "in"))
    write_sink(out, 40, compact_interval=10)
    undo_started = time.time()  # nothing to undo yet: a rollback started together gets there first
    code, doc = cli_json("rollback", ckpt, "--to-batch", "30", "--sink", out, "--yes")
    assert code == 0, doc
    with pytest.raises(RefusedError) as e:
        run(UndoOperation(ckpt, started=undo_started), RunOptions(yes=True))
    assert "journaled after this undo started" in e.value.problem, e.value.problem
    assert _statuses(ckpt) == [(30, False)]


def test_a_resume_started_before_an_undo_finished_is_refused_too(rolled_twice):
    ckpt, _ = rolled_twice
    resume_started = time.time()
    code, doc = cli_json("undo", ckpt, "--yes")
    assert code == 0, doc
    with pytest.raises(RefusedError) as e:
        run(ResumeOperation(ckpt, started=resume_started), RunOptions(yes=True))
    assert "after this resume started" in e.value.problem, e.value.problem
