"""A file sink's output moved or copied elsewhere (its log still names the files at the old place): commands that
would take what the log does not name from the listing refuse instead (fast tier, no Spark)."""

from __future__ import annotations

import os
import shutil

import pytest

from benchmarks import synthetic
from tests.helpers import cli_json, tree_snapshot
from tests.synthetic_sink import write_sink


@pytest.mark.parametrize("how", ["moved", "copied"])
def test_a_rollback_with_a_damaged_log_refuses_an_output_that_moved(tmp_path, how):
    """The removed batches' log damaged (a compact file missing), so what they wrote is taken from the listing: in a
    moved output every file the kept batches' entries name looked unlisted, and the rollback deleted every data file
    (a hostile review). Refused, as it is with a whole log: exit 1, nothing changed."""
    ck, out, elsewhere = str(tmp_path / "ck"), str(tmp_path / "out"), str(tmp_path / "elsewhere")
    synthetic.write_local(ck, batches=12, partitions=2, retain_state=20)
    write_sink(out, 12)  # no compaction: the log has a gap at 9.compact, which the tool treats as damage
    (shutil.move if how == "moved" else shutil.copytree)(out, elsewhere)
    before = tree_snapshot(ck, elsewhere)
    code, r = cli_json("rollback", ck, "--sink", elsewhere, "--to-batch", "8", "--yes")
    assert code == 1, r
    assert "outside the output directory" in r["problem"] and "copied or moved" in r["problem"], r
    assert "original location" in r["fix"], r
    assert tree_snapshot(ck, elsewhere) == before


def test_orphans_of_an_output_that_moved_are_refused_not_every_file(tmp_path):
    """`sink orphans` on a copied or moved output listed every data file as an orphan, and `--delete` deleted them all
    (a hostile review). Refused in every mode: exit 1, nothing changed; at the original place the same command finds
    none."""
    out, elsewhere = str(tmp_path / "out"), str(tmp_path / "elsewhere")
    write_sink(out, 12, compact_interval=10)
    shutil.copytree(out, elsewhere)
    before = tree_snapshot(elsewhere)
    for mode in ([], ["--delete", "--yes", "--force"]):
        code, r = cli_json("sink", "orphans", elsewhere, "--min-age", "0s", *mode)
        assert code == 1 and "outside this output directory" in r["problem"], r
    assert tree_snapshot(elsewhere) == before
    code, r = cli_json("sink", "orphans", out, "--min-age", "0s")
    assert code == 0 and r["plan"]["summary"]["orphan files"] == [], r
    assert len([n for n in os.listdir(elsewhere) if n.startswith("part-")]) == 12
