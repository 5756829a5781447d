"""A backup racing a rollback: the rollback fences ``metadata`` after the backup fixed its cut (no fence then)
and before it read ``metadata``. The backup then holds the fence where Spark expects the query's metadata:
a restore of it is fenced by an operation whose journal is not there, and neither ``resume`` nor ``undo``
can finish it (a hostile review published such a backup, verified and listed). It must publish nothing.

The interleaving is made exact with an audit hook (``sys.addaudithook``): when the backup opens the
checkpoint's ``metadata`` for the second time (the first is its check for a fence, the second its read of
the files it copies), a real rollback, killed by the crash switch right after writing its fence, runs
first. Fast tier: a synthetic checkpoint in Spark's formats (``benchmarks/synthetic.py``), no Spark."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from benchmarks import synthetic
from checkpoint_ops.backup.create import create_backup
from checkpoint_ops.errors import RefusedError
from checkpoint_ops.fence import is_fence
from checkpoint_ops.storage.killswitch import KILL_ENV

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rollback_killed(ckpt: str, kill_at: int) -> int:
    env = dict(os.environ, **{KILL_ENV: str(kill_at)})
    return subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", "rollback", ckpt, "--to-batch", "12", "--yes"],
                          env=env, cwd=ROOT, capture_output=True).returncode


def _fencing_kill(pristine: str, scratch: str) -> int:
    """The first crash-switch count at which a killed rollback of this checkpoint leaves its fence."""
    for kill_at in range(1, 40):
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.copytree(pristine, scratch)
        assert _rollback_killed(scratch, kill_at) == -9
        if is_fence(open(os.path.join(scratch, "metadata"), "rb").read()):
            return kill_at
    raise AssertionError("no killed rollback left its fence")


def test_a_rollback_fencing_the_checkpoint_while_a_backup_reads_it_publishes_nothing(tmp_path):
    pristine, ckpt, dest = str(tmp_path / "pristine"), str(tmp_path / "ckpt"), str(tmp_path / "dest")
    synthetic.write_local(pristine, batches=20, partitions=2, retain_state=25, input_dir=str(tmp_path / "in"))
    kill_at = _fencing_kill(pristine, str(tmp_path / "scratch"))
    shutil.copytree(pristine, ckpt)
    metadata = os.path.join(ckpt, "metadata")
    opened = {"n": 0, "armed": True}

    def rollback_starts_now(event, args):
        if opened["armed"] and event == "open" and args and args[0] == metadata:
            opened["n"] += 1
            if opened["n"] == 2:  # the backup's read of the files it copies, after its check for a fence
                opened["armed"] = False
                assert _rollback_killed(ckpt, kill_at) == -9

    sys.addaudithook(rollback_starts_now)  # cannot be removed: disarmed once it has fired (and below)
    try:
        with pytest.raises(RefusedError) as refused:
            create_backup(ckpt, dest)
    finally:
        opened["armed"] = False
    assert opened["n"] == 2 and is_fence(open(metadata, "rb").read())  # the race happened as intended
    assert "began changing" in refused.value.problem and "no backup was published" in refused.value.problem
    assert "fsck" in refused.value.fix
    manifests = os.path.join(dest, "manifests")  # a backup exists once its manifest is stored there
    assert not os.path.isdir(manifests) or not os.listdir(manifests), os.listdir(manifests)


def test_a_rollback_removing_files_while_the_backup_judges_them_is_no_damage(tmp_path):
    """The rollback runs whole after the backup listed the checkpoint and before it read the restart set of its
    cut: a file it listed is gone when read. That was reported as a damaged checkpoint, "restore this file from a
    backup" (a hostile review), while fsck found it healthy. The backup looks again and backs up the new state."""
    ckpt, dest = str(tmp_path / "ckpt"), str(tmp_path / "dest")
    synthetic.write_local(ckpt, batches=20, partitions=2, retain_state=25, input_dir=str(tmp_path / "in"))
    watched = {os.path.join(ckpt, "offsets", "19"), os.path.join(ckpt, "commits", "19")}
    fired = {"armed": True, "code": None}

    def rollback_runs_now(event, args):
        if fired["armed"] and event == "open" and args and args[0] in watched:
            fired["armed"] = False
            fired["code"] = subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", "rollback", ckpt,
                                            "--to-batch", "12", "--yes"], cwd=ROOT, capture_output=True).returncode

    sys.addaudithook(rollback_runs_now)  # cannot be removed: disarmed once it has fired (and below)
    try:
        summary = create_backup(ckpt, dest)
    finally:
        fired["armed"] = False
    assert fired["code"] == 0 and not os.path.exists(os.path.join(ckpt, "commits", "19"))  # the race happened
    assert summary["batch"] == 12, summary  # the checkpoint as the rollback left it
