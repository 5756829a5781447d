"""A checkpoint whose commits log was deleted (by hand, to make Spark "reprocess"): ``offsets/`` plans batches
0..N and ``commits/`` holds nothing. Spark plans a batch only once the one before it committed, so batches 0..N-1
ran; on restart it runs batch N again and treats the rest as done. fsck said "healthy", rollback "the query
looks active" and backup create "no batch has been committed yet" (a hostile review): none named the deleted
log. Now fsck reports ``commits-behind`` on ``commits`` (exit 1), and rollback and backup create refuse naming
it, changing nothing. Fast tier: a synthetic checkpoint in Spark's formats (benchmarks/synthetic.py), no Spark."""

from __future__ import annotations

import os
import shutil
import time

from benchmarks import synthetic
from tests.helpers import cli_json, tree_snapshot


def _without_commits(tmp_path, keep: tuple[int, ...] = ()) -> str:
    ckpt = str(tmp_path / "ck")
    synthetic.write_local(ckpt, batches=6, partitions=2, retain_state=5)
    for name in os.listdir(f"{ckpt}/commits"):
        if int(name.lstrip(".").split(".")[0]) not in keep:
            os.remove(f"{ckpt}/commits/{name}")
    if not keep:
        shutil.rmtree(f"{ckpt}/commits")
    an_hour_ago = time.time() - 3600  # a stopped query's files (not "a batch is probably running")
    for d, _, files in os.walk(ckpt):
        for n in files:
            os.utime(os.path.join(d, n), (an_hour_ago, an_hour_ago))
    return ckpt


def test_a_deleted_commits_log_is_named_by_fsck_rollback_and_backup(tmp_path):
    ckpt = _without_commits(tmp_path)
    before = tree_snapshot(ckpt)
    code, f = cli_json("fsck", ckpt)
    assert code == 1, f
    (finding,) = f["findings"]
    assert finding["code"] == "commits-behind" and finding["path"].endswith("/commits"), finding
    assert "commits/ holds no commit, but offsets/ plans batches 0..5" in finding["problem"], finding
    assert "Spark runs batch 5 again on restart" in finding["problem"] and "backup" in finding["fix"], finding

    for command in (["rollback", ckpt, "--to-batch", "3", "--yes"],
                    ["backup", "create", ckpt, str(tmp_path / "dest")]):
        code, r = cli_json(*command)
        assert code == 1 and r["error"] == "RefusedError", r
        assert "commits/ holds no commit, but offsets/ plans batches 0..5: batches 0..4 ran" in r["problem"], r
        assert "restore the checkpoint from a backup" in r["fix"], r
    assert tree_snapshot(ckpt) == before
    assert not os.path.exists(tmp_path / "dest") or not os.listdir(tmp_path / "dest")


def test_a_commits_log_that_ends_one_batch_short_is_healthy(tmp_path):
    """The newest batch planned and not committed (a query stopped mid-batch): Spark runs it again, nothing lost."""
    ckpt = _without_commits(tmp_path, keep=tuple(range(5)))
    code, f = cli_json("fsck", ckpt)
    assert code == 0 and f["findings"] == [], f
