"""Batch numbers and retention bounds: a negative batch is a typing slip every command refuses the same way
(exit 2, "must be >= 0", nothing read or written), and ``sink retain`` refuses a rule that reaches the sink log's
last batch (every batch dropped: Spark's readers would see no row of the output), or keeps only batches that
wrote nothing (every file readers see dropped), unless ``--force``. Fast tier:
a synthetic checkpoint in Spark's formats (benchmarks/synthetic.py) and its file sink (tests/synthetic_sink.py)."""

from __future__ import annotations

import os

import pytest

from benchmarks import synthetic
from tests.helpers import cli_json, content_snapshot
from tests.synthetic_sink import write_sink

BATCHES = 6  # batches 0..5


@pytest.fixture
def paired(tmp_path):
    """(checkpoint, output): batches 0..5 each, the output's batches recorded in the checkpoint's ledger."""
    ckpt, out = str(tmp_path / "ck"), str(tmp_path / "out")
    synthetic.write_local(ckpt, batches=BATCHES, partitions=1, retain_state=20)
    write_sink(out, BATCHES)
    code, r = cli_json("ledger", "sync", ckpt, "--sink", out)
    assert code == 0, r
    return ckpt, out


NEGATIVE = {
    "sink files --batch": lambda ck, out: ["sink", "files", out, "--batch", "-3"],
    "sink files --as-of-batch": lambda ck, out: ["sink", "files", out, "--as-of-batch", "-3"],
    "sink retain --keep-after-batch": lambda ck, out: ["sink", "retain", out, "--checkpoint", ck,
                                                       "--keep-after-batch", "-3", "--yes"],
    "offsets --batch": lambda ck, out: ["offsets", ck, "--batch", "-3"],
    "ledger show --batch": lambda ck, out: ["ledger", "show", ck, "--batch", "-3"],
    "rollback --to-batch": lambda ck, out: ["rollback", ck, "--to-batch", "-3", "--sink", out, "--yes"],
}


@pytest.mark.parametrize("command", sorted(NEGATIVE))
def test_a_negative_batch_is_bad_input_everywhere(paired, command):
    ckpt, out = paired
    flag = command.rsplit(" ", 1)[-1]
    before = content_snapshot(ckpt, out)
    code, r = cli_json(*NEGATIVE[command](ckpt, out))
    assert code == 2 and r["error"] == "BadInputError", r
    assert r["problem"] == f"{flag} must be >= 0 (got -3)" and r["fix"], r
    assert content_snapshot(ckpt, out) == before


@pytest.mark.parametrize("rule", [["--keep-after-batch", "99"], ["--keep-after-batch", str(BATCHES - 1)],
                                  ["--older-than", "1d"]], ids=["beyond", "at-the-last", "older-than-all"])
def test_retain_refuses_to_drop_every_batch_of_the_sink_log(paired, rule):
    ckpt, out = paired
    before = content_snapshot(ckpt, out)
    code, r = cli_json("sink", "retain", out, "--checkpoint", ckpt, *rule, "--yes")
    assert code == 1 and r["error"] == "RefusedError", r
    assert "drops every batch left in the sink log (it ends at batch 5)" in r["problem"], r
    assert "would find none" in r["problem"] and r["path"] == out, r
    assert "--force" in r["fix"] and ("--keep-after-batch 4" in r["fix"]), r
    assert content_snapshot(ckpt, out) == before

    code, r = cli_json("sink", "retain", out, "--checkpoint", ckpt, "--keep-after-batch", str(BATCHES - 2),
                       "--dry-run")
    assert code == 0 and "5 batches (0..4)" in r["plan"]["summary"]["retain"], r  # all but the newest: allowed
    code, r = cli_json("sink", "retain", out, "--checkpoint", ckpt, *rule, "--force", "--yes")
    assert code == 0 and "6 batches (0..5)" in r["plan"]["summary"]["retain"], r  # on purpose



@pytest.fixture
def quiet_at_the_end(tmp_path):
    """(checkpoint, output): batches 0..5, of which 4 and 5 wrote no row (their log files list nothing)."""
    ckpt, out = str(tmp_path / "ck"), str(tmp_path / "out")
    synthetic.write_local(ckpt, batches=BATCHES, partitions=1, retain_state=20)
    write_sink(out, BATCHES, empty=frozenset({4, 5}))
    code, r = cli_json("ledger", "sync", ckpt, "--sink", out)
    assert code == 0, r
    return ckpt, out


def test_retain_refuses_to_keep_only_batches_that_wrote_nothing(quiet_at_the_end):
    """The newest batches of a query often write no row (a filter that kept none; in append mode a data batch
    whose windows the next, no-data, batch emits). A rule that keeps only those drops every file readers
    see, exactly as dropping every batch does: refused unless --force (exit 0 before, every data file gone)."""
    ckpt, out = quiet_at_the_end
    before = content_snapshot(ckpt, out)
    code, r = cli_json("sink", "retain", out, "--checkpoint", ckpt, "--keep-after-batch", "3", "--delete-files",
                       "--yes")
    assert code == 1 and r["error"] == "RefusedError", r
    assert "drops every file with rows Spark's readers see in the output (4)" in r["problem"], r
    assert "the batches it keeps (batches 4..5) list no data file" in r["problem"], r
    assert "--keep-after-batch 2 or lower keeps batch 3, the newest that wrote a file readers see" in r["fix"], r
    assert r["path"] == out and "--force" in r["fix"], r
    assert content_snapshot(ckpt, out) == before

    code, r = cli_json("sink", "retain", out, "--checkpoint", ckpt, "--keep-after-batch", "2", "--dry-run")
    assert code == 0 and "3 batches (0..2)" in r["plan"]["summary"]["retain"], r  # batch 3's file stays: allowed
    code, r = cli_json("sink", "retain", out, "--checkpoint", ckpt, "--keep-after-batch", "3", "--delete-files",
                       "--force", "--yes")
    assert code == 0 and "4 batches (0..3)" in r["plan"]["summary"]["retain"], r  # on purpose
    assert not [n for n in os.listdir(out) if n.startswith("part-")]


def test_retain_older_than_refuses_to_keep_only_batches_that_wrote_nothing(quiet_at_the_end):
    """The same by age (the library, at a fixed time: batch b of the synthetic checkpoint ran at
    ``FIRST_BATCH_MS`` + b s): older than 3.5 s before batch 0 + 4 s keeps batches 4 and 5 alone."""
    from checkpoint_ops.errors import RefusedError
    from checkpoint_ops.sinklog import open_context, plan_retain
    from tests.synthetic_sink import FIRST_BATCH_MS

    ckpt, out = quiet_at_the_end
    now = FIRST_BATCH_MS / 1000 + 3.5 + 100
    ctx = open_context(out, ckpt)
    with pytest.raises(RefusedError) as refused:
        plan_retain(ctx, older_than_s=100, now=now)
    assert "drops every file with rows Spark's readers see" in refused.value.problem, refused.value.problem
    assert "--keep-after-batch 2 or lower keeps batch 3" in refused.value.fix, refused.value.fix
    plan = plan_retain(ctx, older_than_s=101, now=now)  # batch 3 (at + 3 s) is kept: its file stays
    assert "3 batches (0..2)" in plan.summary["retain"], plan.summary
