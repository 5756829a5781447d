"""The batch ledger follows the checkpoint's timeline: a sync that finds ``offsets/N`` on disk other than its
record of N forgets its records from there (a backup restored where the original ran on, a query started
again at the same place), so a later rollback never puts an abandoned timeline's files back; a sync of a
fenced checkpoint is refused; ``ledger sync`` takes the leases. Found by a hostile review. Fast tier:
``benchmarks.check_pass.Stream`` (a checkpoint and its file sink in Spark's formats, with retention), no Spark."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from benchmarks import check_pass
from benchmarks.check_pass import Stream
from checkpoint_ops.errors import RefusedError
from checkpoint_ops.lease import acquire_all
from checkpoint_ops.ledger import Ledger, sync
from checkpoint_ops.model.checkpoint import Checkpoint, open_sink
from checkpoint_ops.storage import open_file_manager

HOUR_MS = 3_600_000


def _run(s: Stream, batches: int) -> list[dict]:
    out = []
    for _ in range(batches):
        s.batch()
        ckpt, sinks = s.model()
        out.append(sync(ckpt, sinks, assume_paired=True))  # (the synthetic mtimes do not line up with its times)
    return out


def _offsets_time(data: bytes | str) -> int:
    text = data.decode() if isinstance(data, bytes) else data
    return json.loads(text.splitlines()[1])["batchTimestampMs"]


def _rerun_later(s: Stream, monkeypatch, first: int) -> None:
    """Spark runs the batches from ``first`` again, an hour later (other times in their offsets files)."""
    monkeypatch.setattr(check_pass, "T0", check_pass.T0 + HOUR_MS)
    s.next, s.entries = first, s.entries[:first]


def test_a_checkpoint_restored_where_the_original_ran_on_is_recorded_as_it_runs_again(tmp_path, monkeypatch):
    s = Stream(str(tmp_path), retain=3)  # Spark purges offsets/ and commits/ below the last 3 batches
    assert all(r.get("forgot_from") is None for r in _run(s, 6))  # the usual syncs forget nothing
    shutil.copytree(s.ckpt, str(tmp_path / "backup-ckpt"))  # a backup at batch 5
    shutil.copytree(s.out, str(tmp_path / "backup-out"))
    _run(s, 6)  # the original runs on to batch 11, recorded
    old_8 = Ledger.for_checkpoint(Checkpoint.open(s.ckpt)).raw("offsets", 8)
    shutil.rmtree(s.ckpt)
    shutil.rmtree(s.out)  # restored in place; the ledger beside the checkpoint stays
    shutil.copytree(str(tmp_path / "backup-ckpt"), s.ckpt)
    shutil.copytree(str(tmp_path / "backup-out"), s.out)
    ckpt, sinks = s.model()
    restored = sync(ckpt, sinks, assume_paired=True)  # right after the restore: the ledger is ahead of it
    assert restored["forgot_from"]["batch"] == 6 and restored["batches_recorded"] == 0
    _rerun_later(s, monkeypatch, 6)
    syncs = _run(s, 6)
    ckpt = Checkpoint.open(s.ckpt)
    ledger = Ledger.for_checkpoint(ckpt)
    assert _offsets_time(ledger.raw("offsets", 11)) == _offsets_time(open(os.path.join(s.ckpt, "offsets", "11")).read())
    assert "8" not in os.listdir(os.path.join(s.ckpt, "offsets"))  # purged: only the ledger can give it back
    assert _offsets_time(ledger.raw("offsets", 8)) == _offsets_time(old_8) + HOUR_MS
    assert sorted(ledger.batches("offsets")) == list(range(12))
    assert [r["batches_recorded"] for r in syncs] == [1] * 6
    assert all(r["forgot_from"] is None for r in syncs)  # forgotten once, by the sync right after the restore


def test_a_query_started_again_at_the_same_place_forgets_the_old_querys_records(tmp_path, monkeypatch):
    s = Stream(str(tmp_path), retain=100)
    _run(s, 5)
    shutil.rmtree(s.ckpt)
    shutil.rmtree(s.out)
    fresh = Stream(str(tmp_path), retain=100)  # the same locations, from scratch
    _rerun_later(fresh, monkeypatch, 0)
    first = _run(fresh, 1)[0]
    _run(fresh, 2)
    ledger = Ledger.for_checkpoint(Checkpoint.open(fresh.ckpt))
    for b in range(3):
        assert ledger.raw("offsets", b) == open(os.path.join(fresh.ckpt, "offsets", str(b)), "rb").read()
    assert ledger.batches("offsets") == [0, 1, 2]  # the old query's 3 and 4 forgotten too
    assert first["forgot_from"]["batch"] == 0 and first["batches_recorded"] == 1


def test_a_torn_offsets_file_is_no_evidence_of_another_timeline(tmp_path):
    s = Stream(str(tmp_path), retain=100)
    _run(s, 5)
    open(os.path.join(s.ckpt, "offsets", "4"), "wb").close()  # torn newest file
    ckpt, sinks = s.model()
    got = sync(ckpt, sinks, assume_paired=True)
    assert got["forgot_from"] is None
    assert Ledger.for_checkpoint(Checkpoint.open(s.ckpt)).batches("offsets") == list(range(5))


def test_a_fenced_checkpoint_is_not_synced(tmp_path):
    s = Stream(str(tmp_path), retain=100)
    _run(s, 8)
    env = {**os.environ, "CHECKPOINT_OPS_KILL_AT": "10"}  # a rollback killed part-way: the checkpoint fenced
    cli = [sys.executable, "-m", "checkpoint_ops.cli"]
    killed = subprocess.run([*cli, "rollback", s.ckpt, "--to-batch", "3", "--sink", s.out, "--yes"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode != 0
    ckpt, sinks = s.model()
    assert ckpt.fence is not None
    before = sorted(os.listdir(os.path.join(os.path.dirname(s.ckpt), ".checkpoint-ops", "ckpt", "ledger")))
    with pytest.raises(RefusedError, match="fenced this checkpoint"):
        sync(ckpt, sinks, assume_paired=True)
    after = sorted(os.listdir(os.path.join(os.path.dirname(s.ckpt), ".checkpoint-ops", "ckpt", "ledger")))
    assert after == before  # nothing recorded
    resumed = subprocess.run([*cli, "resume", s.ckpt, "--yes"], capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    ckpt, sinks = s.model()
    sync(ckpt, sinks, assume_paired=True)
    assert Ledger.for_checkpoint(Checkpoint.open(s.ckpt)).batches("offsets") == [0, 1, 2, 3]


def test_ledger_sync_waits_for_no_one_else_holding_the_checkpoint(tmp_path):
    s = Stream(str(tmp_path), retain=100)
    _run(s, 3)
    s.batch()
    fm, root = open_file_manager(s.ckpt)
    cli = [sys.executable, "-m", "checkpoint_ops.cli", "ledger", "sync", s.ckpt, "--sink", s.out, "--assume-paired", "--json"]
    with acquire_all([(fm, root, s.ckpt)], "a rollback elsewhere"):
        held = subprocess.run(cli, capture_output=True, text=True, timeout=120)
        assert held.returncode != 0 and "lease" in held.stderr.lower(), held.stderr
        assert Ledger.for_checkpoint(Checkpoint.open(s.ckpt)).batches("offsets") == [0, 1, 2]
    free = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert free.returncode == 0, free.stderr
    assert json.loads(free.stdout)["batches_recorded"] == 1


def test_a_rollback_does_not_restore_another_timelines_records(tmp_path, monkeypatch):
    """Before any sync saw the new timeline (Spark run by hand on a query started again here), a rollback to
    a batch Spark purged would take it from the ledger, which holds the old query's: refused, with the fix."""
    from checkpoint_ops.ledger import ledger_or_none
    from checkpoint_ops.rollback import plan_rollback

    s = Stream(str(tmp_path), retain=3)
    _run(s, 12)
    shutil.rmtree(s.ckpt)
    shutil.rmtree(s.out)
    fresh = Stream(str(tmp_path), retain=3)
    _rerun_later(fresh, monkeypatch, 0)
    for _ in range(12):
        fresh.batch()  # no sync
    ckpt = Checkpoint.open(fresh.ckpt)
    assert 5 not in ckpt.offset_files
    with pytest.raises(RefusedError, match="not this checkpoint's") as refused:
        plan_rollback(ckpt, 5, ledger=ledger_or_none(ckpt))
    assert "ledger sync" in refused.value.fix
    # Spark's own files cover batch 10: not refused, though the pairing check (with the sink) reads the ledger
    plan = plan_rollback(ckpt, 10, sinks=[open_sink(fresh.out)], ledger=ledger_or_none(ckpt))
    assert plan.target_batch == 10


def test_a_sync_after_segments_a_clock_ahead_wrote_still_forgets_the_old_timeline(tmp_path, monkeypatch):
    """The original's syncs ran on a host whose clock was 2 minutes ahead: the timeline truncation (and every
    segment after it) still sorts after them, so it hides the old records (it sorted before them and hid
    nothing, and the sync said it forgot them)."""
    import time

    from checkpoint_ops import ledger as ledger_module

    def two_minutes_ahead() -> str:
        t = time.time_ns() // 1000 + 120_000_000
        return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(t // 1_000_000))}.{t % 1_000_000:06d}Z"

    s = Stream(str(tmp_path), retain=3)
    with monkeypatch.context() as ahead:
        ahead.setattr(ledger_module, "utc_stamp", two_minutes_ahead)
        _run(s, 6)
        shutil.copytree(s.ckpt, str(tmp_path / "backup-ckpt"))
        shutil.copytree(s.out, str(tmp_path / "backup-out"))
        _run(s, 6)
    shutil.rmtree(s.ckpt)
    shutil.rmtree(s.out)
    shutil.copytree(str(tmp_path / "backup-ckpt"), s.ckpt)
    shutil.copytree(str(tmp_path / "backup-out"), s.out)
    _rerun_later(s, monkeypatch, 6)
    syncs = _run(s, 6)
    ledger = Ledger.for_checkpoint(Checkpoint.open(s.ckpt))
    for b in (9, 10, 11):
        assert ledger.raw("offsets", b) == open(os.path.join(s.ckpt, "offsets", str(b)), "rb").read()
    assert _offsets_time(ledger.raw("offsets", 8)) == check_pass.T0 + 8 * 10_000
    assert [r["forgot_from"]["batch"] if r["forgot_from"] else None for r in syncs] == [6, None, None, None, None, None]
    assert ledger.segments == sorted(ledger.segments) and "-truncate-timeline-" in ledger.segments[-7]


def test_a_lost_newest_offsets_file_is_not_another_timeline(tmp_path):
    """offsets/11 deleted by hand (its commit kept): the ledger's record of it is this checkpoint's and may be
    the only copy; the sync keeps it and a rollback to 11 restores it."""
    from checkpoint_ops.ledger import ledger_or_none
    from checkpoint_ops.rollback import plan_rollback

    s = Stream(str(tmp_path), retain=100)
    _run(s, 12)
    recorded = open(os.path.join(s.ckpt, "offsets", "11"), "rb").read()
    for name in ("11", ".11.crc"):
        os.remove(os.path.join(s.ckpt, "offsets", name))
    ckpt, sinks = s.model()
    assert sync(ckpt, sinks, assume_paired=True)["forgot_from"] is None
    ckpt = Checkpoint.open(s.ckpt)
    assert Ledger.for_checkpoint(ckpt).raw("offsets", 11) == recorded
    plan = plan_rollback(ckpt, 11, ledger=ledger_or_none(ckpt), force=True)
    assert [a.rel for a in plan.actions if a.kind == "write"] == ["offsets/11"]
