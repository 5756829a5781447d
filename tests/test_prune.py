"""history and prune: the undo records (trash) of finished rollbacks, on checkpoints Spark wrote."""

from __future__ import annotations

import os
import time

import pytest

from checkpoint_ops.model.checkpoint import Checkpoint
from checkpoint_ops.executor import Anchor
from checkpoint_ops.prune import plan_prune
from tests.helpers import cli, cli_json, is_lease_file, tree_snapshot
from tests.test_rollback_s3 import objects, upload
from tests.test_rollback_spark import FENCED, INTERVALS, _rollback_subprocess, content_snapshot, \
    target_before_last_compaction


# the `run` fixture (conftest) of one state-store flavour: pruning does not depend on it
HDFS = pytest.mark.parametrize("flavour", ["hdfs"])


def _rollback(run, n):
    code, r = cli_json("rollback", run.checkpoint, "--to-batch", n, "--sink", run.output, *INTERVALS, "--yes")
    assert code == 0, r
    return r["result"]["op_id"]


def _trash(run, op_id, root="checkpoint"):
    name = os.path.basename(run.checkpoint if root == "checkpoint" else run.output)
    return os.path.join(run.base, ".checkpoint-ops", name, "trash", op_id)


def _files_under(d):
    return sorted(os.path.relpath(os.path.join(p, f), d) for p, _, fs in os.walk(d) for f in fs)


@HDFS
def test_prune_keeps_the_newest_undoable_and_undo_refuses_the_pruned(run):
    n = target_before_last_compaction(run)
    first = _rollback(run, n)
    after_first = content_snapshot(run.checkpoint, run.output)
    second = _rollback(run, n - 2)

    code, h = cli_json("history", run.checkpoint)
    assert code == 0
    assert [(e["op_id"], e["status"], e["undo_record"]) for e in h["operations"]] == [
        (first, "applied", "kept"), (second, "applied", "kept")]
    code, out, err = cli("history", run.checkpoint)  # kept records, but only the newest is for undo (review)
    assert code == 0 and "undo reverts the newest operation only" in out and "--dry-run` says" in out, out + err

    # the dry run lists exactly the first operation's trash (checkpoint and sink) and changes nothing
    before = tree_snapshot(run.base)
    code, dry = cli_json("prune", run.checkpoint, "--keep-last", "1", "--dry-run")
    assert code == 0 and dry["dry_run"] is True
    planned = sorted((a["root"], a["rel"]) for a in dry["plan"]["actions"])
    expected = sorted([(f"{first}/checkpoint", r) for r in _files_under(_trash(run, first))]
                      + [(f"{first}/sink0", r) for r in _files_under(_trash(run, first, "sink0"))])
    assert planned == expected and len(planned) > 0
    assert dry["plan"]["summary"]["prune"] == [first]
    assert tree_snapshot(run.base) == before

    second_trash = {p: d for p, d in tree_snapshot(_trash(run, second)).items()}
    code, r = cli_json("prune", run.checkpoint, "--keep-last", "1", "--yes")
    assert code == 0, r
    assert r["result"]["pruned"] == [first] and r["result"]["plan_hash"] == dry["plan"]["plan_hash"]
    assert not os.path.exists(_trash(run, first)) and not os.path.exists(_trash(run, first, "sink0"))
    assert tree_snapshot(_trash(run, second)) == second_trash  # the newest stays undoable, untouched

    code, h = cli_json("history", run.checkpoint)
    assert [e["undo_record"] for e in h["operations"]] == ["pruned", "kept"]

    code, u = cli_json("undo", run.checkpoint, "--yes")
    assert code == 0, u
    assert content_snapshot(run.checkpoint, run.output) == after_first
    before = tree_snapshot(run.base)
    code, u = cli_json("undo", run.checkpoint, "--yes")
    assert code == 1 and "pruned" in u["problem"] and first in u["problem"]
    assert tree_snapshot(run.base) == before

    code, again = cli_json("prune", run.checkpoint, "--keep-last", "0", "--yes")
    assert code == 0 and again["plan"]["summary"]["prune"] == "nothing"


@HDFS
def test_prune_by_age(run):
    op = _rollback(run, target_before_last_compaction(run))
    ckpt = Anchor.of_checkpoint(Checkpoint.open(run.checkpoint))
    assert plan_prune(ckpt, older_than_s=86400).summary["prune"] == "nothing"
    later = plan_prune(ckpt, older_than_s=86400, now=time.time() + 2 * 86400)
    assert later.summary["prune"] == [op] and len(later.actions) > 0
    # both limits: only what is beyond the newest K *and* old enough
    assert plan_prune(ckpt, keep_last=1, older_than_s=86400, now=time.time() + 2 * 86400).summary["prune"] == "nothing"


@HDFS
def test_prune_never_touches_an_interrupted_rollback(run):
    n = target_before_last_compaction(run)
    proc = _rollback_subprocess(run, n, {"CHECKPOINT_OPS_KILL_AT": str(FENCED + 8)})
    assert proc.returncode == -9
    before = tree_snapshot(run.base)
    code, r = cli_json("prune", run.checkpoint, "--keep-last", "0", "--yes")
    assert code == 0 and r["plan"]["summary"]["prune"] == "nothing"
    assert "in-progress" in r["plan"]["summary"]["skipped"][0]
    # nothing changed but the killed rollback's lease, which prune took over (its pid is gone) and released
    taken_over = [p for p in before if is_lease_file(p) and os.path.dirname(p) == run.checkpoint]
    assert taken_over and tree_snapshot(run.base) == {p: v for p, v in before.items() if p not in taken_over}
    code, r = cli_json("rollback", run.checkpoint, "--resume", *INTERVALS)
    assert code == 0, r


@HDFS
def test_prune_needs_a_policy(run):
    code, r = cli_json("prune", run.checkpoint, "--yes")
    assert code == 2 and "--keep-last" in r["problem"]


@pytest.mark.parametrize("flavour", ["rocksdb_v2"])
def test_prune_on_s3_deletes_the_copied_trash(run, bucket, s3_server):
    url = upload(run, bucket, s3_server, versioned=False)  # unversioned: deleted objects were copied aside
    code, r = cli_json("rollback", url, "--to-batch", target_before_last_compaction(run), *INTERVALS, "--yes")
    assert code == 0, r
    op = r["result"]["op_id"]
    trash_prefix = f".checkpoint-ops/ckpt/trash/{op}/"
    assert len(objects(s3_server, bucket, trash_prefix)) == r["plan"]["counts"]["delete"]
    checkpoint_now = objects(s3_server, bucket)
    code, p = cli_json("prune", url, "--keep-last", "0", "--yes")
    assert code == 0, p
    assert p["result"]["pruned"] == [op]
    assert objects(s3_server, bucket, trash_prefix) == {}
    assert objects(s3_server, bucket) == checkpoint_now  # the checkpoint itself is untouched
    assert objects(s3_server, bucket, f".checkpoint-ops/ckpt/journal/{op}/")  # the journal stays, as history
    code, u = cli_json("undo", url, "--yes")
    assert code == 1 and "pruned" in u["problem"]
