"""Batch numbers and retention bounds: a negative batch is a typing slip every command refuses the same way
(exit 2, "must be >= 0", nothing read or written), and ``sink retain`` refuses a rule that reaches the sink log's
last batch (every batch dropped: Spark's readers would see no row of the output) unless ``--force``. Fast tier:
a synthetic checkpoint in Spark's formats (benchmarks/synthetic.py) and its file sink (tests/synthetic_sink.py)."""

from __future__ import annotations

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
