"""Two mutating commands started at the same moment: exactly one applies, the other changes nothing.

Each trial starts two ``checkpoint-ops`` commands in two warm fork servers (``tests/crash.py`` ``race``:
both children fork within milliseconds, behind one barrier) on a checkpoint real Spark wrote, reset
before the trial. The operation layer (``operation.run``) takes the lease of every root a command
changes before it reads anything, so for every trial:

* exactly one command applies (exit 0, an applied result);
* the other exits 1, refused by the lease and naming its holder (owner, host, the winner's pid, since
  when), or, had it started only after the winner finished, refused for a reason that changes nothing
  (exit 1; or exit 2 for a restore into a target that is no longer empty);
* the tree is exactly (byte for byte, over what Spark reads) what the winner alone leaves, and no lease
  is left behind;
* ``history`` shows exactly what applied, ``fsck`` is clean;
* ``undo`` brings back exactly the tree before the race (for a restore: the result is exactly a lone
  restore's, and undo empties the target again); once per pair, instead, Spark resumes from the raced
  result with exact output.

A lease is not a queue: a command that reaches it only after the other released it runs after it (a
forked child may take a few hundred milliseconds to get there on a loaded machine, as long as a whole
operation takes). Such an attempt is not a race; it is checked to leave exactly what running the two one
after the other leaves, counted as *serialised*, and another attempt is made.

The rows go to docs/reliability.md (``make reliability``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from typing import Callable

import boto3
import pytest
import s3fs

from checkpoint_ops.pairing import PAIRING_FILE
from pipelines.event_counts import event_rows, write_event_files
from tests.crash import Finished, ForkRunner, RaceRow, race, record
from tests.helpers import cli_json, content_snapshot, is_lease_file, is_own_file
from tests.spark_runs import COMPACT_INTERVAL, SparkRun, run_stateless
from tests.test_crash_matrix import _copy_prefix, _listing, small_run  # noqa: F401  (a fixture)
from tests.test_rollback_spark import INTERVALS, exact, finish_and_read, target_before_last_compaction
from tests.test_sink_spark import sink_run  # noqa: F401  (a fixture)

TRIALS_LOCAL = 20  # rollback x rollback on local disk
TRIALS_S3 = 5  # rollback x rollback with the checkpoint on the S3 server
TRIALS = 5  # every other pair
HDFS = pytest.mark.parametrize("flavour", ["hdfs"])
SINK = ("--sink-compact-interval", str(COMPACT_INTERVAL))


@pytest.fixture(scope="module")
def runners():
    pair = [ForkRunner(), ForkRunner()]
    yield pair
    for r in pair:
        r.close()


def _spark_content(*roots: str) -> dict[str, str]:
    """What Spark reads under the roots (checkpoint-ops' own records, the lease and the pairing record, left out)."""
    return content_snapshot(*roots)


def _leases_left(*roots: str) -> list[str]:
    return [os.path.join(d, n) for root in roots for d, _, names in os.walk(root) for n in names
            if is_lease_file(os.path.join(d, n))]


def judge(results: list[Finished], names: list[str], row: RaceRow) -> int | None:
    """Exactly one applied; the other was refused (by the winner's lease, naming it, or, had it started after
    the winner finished, for another reason). Returns the winner's index; None if both applied (one after
    the other: ``Pair.trials`` checks that and tries again)."""
    applied = [i for i, r in enumerate(results) if r.applied]
    detail = [(names[i], r.code, r.error.get("problem") or r.err[-600:]) for i, r in enumerate(results)]
    if len(applied) == len(results):
        return None
    row.trials += 1
    assert len(applied) == 1, f"not exactly one applied: {detail}"
    winner = applied[0]
    loser = results[1 - winner]
    problem = loser.error.get("problem", "")
    assert problem and loser.error.get("fix"), f"the loser printed no error record: {detail}"
    assert loser.code == 1 or (loser.code == 2 and "is in use" not in problem), f"the loser exited {loser.code}: {detail}"
    if "is in use" in problem:
        won = results[winner]
        for part in (f"host {socket.gethostname()}", f"pid {won.pid}", "since ", "checkpoint-ops "):
            assert part in problem, f"the refusal does not name the holder ({part!r}): {problem}"
        assert "lease break" in loser.error["fix"], loser.error
        row.lease_refusals += 1
    row.one_applied += 1
    return winner


@dataclass
class Pair:
    """Two commands raced on one tree: how to reset it, and what Spark reads there (to compare)."""

    row: RaceRow
    commands: list[list]
    names: list[str]
    reset: Callable[[], None]
    state: Callable[[], object]
    roots: tuple[str, ...] = ()  # local roots that must hold no lease afterwards
    _alone: dict = field(default_factory=dict)
    _in_turn: dict = field(default_factory=dict)

    def alone(self, runner: ForkRunner, i: int):
        """What command i leaves when it runs alone."""
        if i not in self._alone:
            self.reset()
            code, out, err = runner.run(*self.commands[i])
            assert code == 0 and json.loads(out)["result"] is not None, (out, err)
            self._alone[i] = self.state()
        return self._alone[i]

    def in_turn(self, runner: ForkRunner, order: tuple[int, ...]):
        """What the commands leave when run one after the other in ``order`` (a later one may be refused)."""
        if order not in self._in_turn:
            self.reset()
            for i in order:
                code, out, err = runner.run(*self.commands[i])
                assert code in (0, 1, 2), (out, err)  # 2: a restore into a target no longer empty
            self._in_turn[order] = self.state()
        return self._in_turn[order]

    def trials(self, runners: list[ForkRunner], n: int, check: Callable[[int, int], None]) -> None:
        """Race the two ``n`` times (attempts where they ran one after the other are checked, not counted);
        ``check(trial, winner)`` does what each trial must show beyond the tree (history, fsck, undo, Spark)."""
        for i in range(len(self.commands)):
            self.alone(runners[0], i)
        attempts = 0
        while self.row.trials < n:
            attempts += 1
            assert attempts <= 2 * n + 5, f"only {self.row.trials} of {attempts} attempts raced: {self.row}"
            self.reset()
            results = race(runners, self.commands)
            winner = judge(results, self.names, self.row)
            if winner is None:
                got = self.state()
                assert got in (self.in_turn(runners[0], (0, 1)), self.in_turn(runners[0], (1, 0))), \
                    "both applied, and the result is not what running them one after the other leaves"
                self.row.serialised += 1
                continue
            trial = self.row.trials - 1
            assert self.state() == self.alone(runners[0], winner), f"trial {trial}: not what the winner alone leaves"
            assert not _leases_left(*self.roots), f"trial {trial}: a lease was left behind"
            check(trial, winner)
            self.row.converged += 1
        record(self.row)


def history(anchor: str) -> list[tuple[str, int | None, str]]:
    code, h = cli_json("history", anchor, *INTERVALS)
    assert code == 0, h
    return [(e["operation"], e["target_batch"], e["status"]) for e in h["operations"]]


def fsck_clean(ckpt: str, *sinks: str) -> None:
    args = [a for s in sinks for a in ("--sink", s)]
    code, f = cli_json("fsck", ckpt, *args, *INTERVALS)
    assert (code, f["findings"]) == (0, []), f["findings"]


# ---- rollback x rollback -----------------------------------------------------------------------------------


@HDFS
def test_rollback_x_rollback_local(spark, run, runners):
    """Two rollbacks to different batches, started together 20 times."""
    roots = (run.checkpoint, run.output)
    n = target_before_last_compaction(run)
    targets = [n, n + 1]
    commands = [["rollback", run.checkpoint, "--to-batch", t, "--sink", run.output, *INTERVALS, "--yes", "--json"]
                for t in targets]
    original = _spark_content(*roots)
    pair = Pair(RaceRow("rollback × rollback", "local"), commands, [f"rollback to {t}" for t in targets], run.reset,
                lambda: _spark_content(*roots), roots)

    def check(trial, winner):
        assert history(run.checkpoint) == [("rollback", targets[winner], "applied")]
        fsck_clean(run.checkpoint, run.output)
        if trial == TRIALS_LOCAL - 1:  # Spark resumes from the raced result, exactly
            assert finish_and_read(spark, run) == exact(run)
            pair.row.spark_checked += 1
        else:
            code, u = cli_json("undo", run.checkpoint, "--yes")
            assert code == 0, u
            assert _spark_content(*roots) == original, f"trial {trial}: undo is not byte-exact"

    pair.trials(runners, TRIALS_LOCAL, check)


def _s3_spark_content(s3, bucket: str, prefix: str) -> dict[str, str]:
    return {k: v for k, v in _listing(s3, bucket, prefix).items() if not is_own_file(k)}


def test_rollback_x_rollback_s3(small_run, runners, bucket, s3_server):  # noqa: F811
    """The same race with the checkpoint on the S3 server (leases are If-None-Match puts there), its file
    sink on local disk."""
    s3 = boto3.client("s3", endpoint_url=s3_server)
    base = small_run
    local_ckpt, output = os.path.join(base, "checkpoint"), os.path.join(base, "output")
    s3fs.S3FileSystem(endpoint_url=s3_server, skip_instance_cache=True).put(local_ckpt + "/", f"{bucket}/pristine/ckpt",
                                                                            recursive=True)
    pristine = _listing(s3, bucket, "pristine")
    ckpt = f"s3://{bucket}/work/ckpt"

    def reset():
        _copy_prefix(s3, bucket, "pristine", "work", pristine)
        shutil.rmtree(base)
        shutil.copytree(base + ".pristine", base, symlinks=True)

    def state():
        return _s3_spark_content(s3, bucket, "work/ckpt"), _spark_content(output)

    last = max(int(x) for x in os.listdir(os.path.join(local_ckpt, "commits")) if x.isdigit())
    targets = [last - 2, last - 1]
    commands = [["rollback", ckpt, "--to-batch", t, "--sink", output, *INTERVALS, "--yes", "--json"] for t in targets]
    reset()
    original = state()
    pair = Pair(RaceRow("rollback × rollback", "s3 + local sink"), commands, [f"rollback to {t}" for t in targets],
                reset, state, (output,))

    def check(trial, winner):
        assert not [k for k in _listing(s3, bucket, "work/ckpt") if is_lease_file(k)]
        assert history(ckpt) == [("rollback", targets[winner], "applied")]
        fsck_clean(ckpt, output)
        code, u = cli_json("undo", ckpt, "--yes")
        assert code == 0, u
        assert state() == original, f"trial {trial}: undo is not byte-exact"

    pair.trials(runners, TRIALS_S3, check)
    shutil.rmtree(base)
    shutil.copytree(base + ".pristine", base, symlinks=True)


# ---- rollback x undo ---------------------------------------------------------------------------------------


@HDFS
def test_rollback_x_undo_local(spark, run, runners, tmp_path):
    """A rollback applied; then a second rollback (one batch further back) and its undo start together."""
    roots = (run.checkpoint, run.output)
    n = target_before_last_compaction(run)
    first = ["rollback", run.checkpoint, "--to-batch", n, "--sink", run.output, *INTERVALS, "--yes", "--json"]
    second = ["rollback", run.checkpoint, "--to-batch", n - 1, "--sink", run.output, *INTERVALS, "--yes", "--json"]
    undo = ["undo", run.checkpoint, "--yes", "--json"]
    original = _spark_content(*roots)
    assert runners[0].run(*first)[0] == 0
    rolled = _spark_content(*roots)
    saved = str(tmp_path / "rolled-back")
    shutil.copytree(run.base, saved, symlinks=True)

    def reset_rolled():
        shutil.rmtree(run.base)
        shutil.copytree(saved, run.base, symlinks=True)

    pair = Pair(RaceRow("rollback × undo", "local"), [second, undo], [f"rollback to {n - 1}", "undo"], reset_rolled,
                lambda: _spark_content(*roots), roots)

    def check(trial, winner):
        fsck_clean(run.checkpoint, run.output)
        if winner == 0:
            assert history(run.checkpoint) == [("rollback", n, "applied"), ("rollback", n - 1, "applied")]
        else:
            assert _spark_content(*roots) == original
            assert history(run.checkpoint) == [("rollback", n, "undone")]
        if trial == TRIALS - 1:
            assert finish_and_read(spark, run) == exact(run)
            pair.row.spark_checked += 1
            return
        code, u = cli_json("undo", run.checkpoint, "--yes")
        if winner == 0:
            assert code == 0, u
            assert _spark_content(*roots) == rolled, f"trial {trial}: undo is not byte-exact"
        else:  # the undo won: nothing is left to undo, and the tree stays as it was before the first rollback
            assert code == 1 and "nothing to undo" in u["problem"], u
            assert _spark_content(*roots) == original

    pair.trials(runners, TRIALS, check)
    reset_rolled()


# ---- rollback x sink compact -------------------------------------------------------------------------------


def _reset_sink_run(base: str, paired: bool = True) -> None:
    """The pristine tree, its output aged; ``paired=False``: without the output's pairing record (a sink
    nothing pairs with its checkpoint yet, which ``sink compact`` takes without ``--checkpoint``)."""
    shutil.rmtree(base)
    shutil.copytree(base + ".pristine", base, symlinks=True)
    if not paired:
        for name in (PAIRING_FILE, f".{PAIRING_FILE}.crc"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(base, "output", name))
    hour_ago = time.time() - 3600  # the query stopped an hour ago (a fresh sink log looks like a running query)
    for d, _, names in os.walk(os.path.join(base, "output")):
        for name in names:
            os.utime(os.path.join(d, name), (hour_ago, hour_ago))


def _sink_rows(spark, out: str) -> list:
    return sorted(tuple(r) for r in spark.read.parquet(out).collect())


@pytest.mark.parametrize("with_checkpoint", [True, False], ids=["compact-with-checkpoint", "compact-sink-only"])
def test_rollback_x_sink_compact_local(spark, sink_run, runners, with_checkpoint):  # noqa: F811
    """A rollback and an offline compaction of its sink. With ``--checkpoint`` both lease the checkpoint
    first; without it (an output no pairing record ties to the checkpoint yet: a paired one is refused
    without it) the compaction leases only the sink output, and that lease alone serialises them."""
    base = sink_run
    ckpt, out, inp = f"{base}/checkpoint", f"{base}/output", f"{base}/input"
    roots = (ckpt, out)
    _reset_sink_run(base, paired=with_checkpoint)
    last = max(int(x) for x in os.listdir(f"{ckpt}/commits") if x.isdigit())
    n = (last + 1) // COMPACT_INTERVAL * COMPACT_INTERVAL - 3  # two batches before the last compaction
    rollback = ["rollback", ckpt, "--to-batch", n, "--sink", out, *INTERVALS, "--yes", "--json"]
    compact = ["sink", "compact", out, *(["--checkpoint", ckpt] if with_checkpoint else []), *SINK, "--yes", "--json"]
    anchors = [ckpt, ckpt if with_checkpoint else out]
    original = _spark_content(*roots)
    name = "rollback × sink compact" + (" --checkpoint" if with_checkpoint else " (sink lease only)")
    pair = Pair(RaceRow(name, "local"), [rollback, compact], ["rollback", "sink compact"],
                lambda: _reset_sink_run(base, paired=with_checkpoint), lambda: _spark_content(*roots), roots)

    def check(trial, winner):
        journaled = [entry for anchor in sorted({*anchors}) for entry in history(anchor)]
        assert journaled == ([("rollback", n, "applied")] if winner == 0 else [("sink-compact", last, "applied")])
        fsck_clean(ckpt, out)
        if trial == TRIALS - 1:  # Spark resumes from the raced result and writes two more batches, exactly
            files = len([f for f in os.listdir(inp) if f.endswith(".json")])
            write_event_files(inp, files, files + 2)
            run_stateless(spark, base)
            assert _sink_rows(spark, out) == sorted((e["key"], e["value"]) for b in range(files + 2)
                                                    for e in event_rows(b))
            pair.row.spark_checked += 1
        else:
            code, u = cli_json("undo", anchors[winner], "--yes")
            assert code == 0, u
            assert _spark_content(*roots) == original, f"trial {trial}: undo is not byte-exact"

    pair.trials(runners, TRIALS, check)
    assert pair.alone(runners[0], 1) != original
    _reset_sink_run(base)


# ---- restore x restore -------------------------------------------------------------------------------------


@HDFS
def test_restore_x_restore_local(spark, run, runners, tmp_path):
    """Two restores of one backup into one target, started together: one restores, the other is refused
    (by the lease, or by the target no longer being empty) and writes nothing there."""
    dest = str(tmp_path / "dest")
    code, o, err = runners[0].run("backup", "create", run.checkpoint, dest, "--sink", run.output, *INTERVALS, "--json")
    assert code == 0, err
    backup_id = json.loads(o)["backup_id"]
    target = str(tmp_path / "target")
    ckpt, out, inp = f"{target}/checkpoint", f"{target}/output", f"{target}/input"
    shutil.copytree(run.input, inp)
    restore = ["backup", "restore", dest, backup_id, ckpt, "--sink-target", out, "--relocate", f"{run.input}={inp}",
               "--yes", "--json"]

    def reset():
        for d in (ckpt, out, f"{target}/.checkpoint-ops"):
            shutil.rmtree(d, ignore_errors=True)

    pair = Pair(RaceRow("restore × restore (one target)", "local"), [restore, restore], ["restore", "restore"], reset,
                lambda: _spark_content(ckpt, out), (ckpt, out))

    def check(trial, winner):
        assert history(ckpt) == [("restore", run.last_batch, "applied")]
        fsck_clean(ckpt, out)
        if trial == TRIALS - 1:  # Spark resumes from the raced restore, at its new location, exactly
            restored = SparkRun(run.flavour, target, progress=run.progress, files=run.files)
            assert finish_and_read(spark, restored) == exact(run)
            pair.row.spark_checked += 1
        else:
            code, u = cli_json("undo", ckpt, "--yes")
            assert code == 0, u
            assert _spark_content(ckpt, out) == {}, f"trial {trial}: undo did not empty the target"

    pair.trials(runners, TRIALS, check)
    assert pair.alone(runners[0], 0)
