"""A compactible log holds the parsed entries of at most ``CompactibleLog.COMPACTS_HELD`` compact files. A compact
file holds every entry so far, so holding each one the window or fsck parsed grew with the square of the batches:
on a sink whose compact files are all kept (log deletion off), a cold ``inspect`` at 3,000 batches peaked at 417 MB
and the first pass at 10,000 at 5.4 GB (docs/benchmarks.md). Fast tier: ``benchmarks.check_pass.Stream``, no Spark.
"""

from __future__ import annotations

from benchmarks.check_pass import INTERVAL, Stream
from checkpoint_ops.fsck import run_fsck
from checkpoint_ops.inspect import inspect_checkpoint
from checkpoint_ops.model.compactible import CompactibleLog


def _held(log: CompactibleLog) -> list[int]:
    return sorted(b for b in log._entries if log.files[b].compact)


def test_a_log_holds_few_compact_files_and_reads_a_dropped_one_again_alike(tmp_path):
    s = Stream(str(tmp_path), retain=1000)
    for _ in range(12 * INTERVAL + 3):
        s.batch()
    _, (sink,) = s.model()
    log = sink.log
    assert len(log.compact_ids) == 12
    first = {b: [e.raw for e in log.entries_after(b)] for b in sorted(log.files, reverse=True)}  # as the window asks
    assert len(_held(log)) <= CompactibleLog.COMPACTS_HELD, _held(log)
    assert all(log.is_checked(b) for b in log.compact_ids)  # a dropped file stays known readable
    # asked again in another order, every answer is what a fresh model reads
    _, (fresh,) = s.model()
    for b in sorted(first):
        assert [e.raw for e in log.entries_after(b)] == first[b] == [e.raw for e in fresh.log.entries_after(b)]
        assert len(_held(log)) <= CompactibleLog.COMPACTS_HELD
    assert first[max(first)] and len(first[max(first)]) == 12 * INTERVAL + 3


def test_inspect_and_fsck_leave_few_compact_files_parsed_and_judge_as_before(tmp_path):
    """The window (inspect) and fsck each parse every compact file; afterwards few are held, and a damaged one is
    still named."""
    s = Stream(str(tmp_path), retain=1000)
    for _ in range(8 * INTERVAL):
        s.batch()
    ckpt, sinks = s.model()
    report = inspect_checkpoint(ckpt, sinks)
    assert (report["rollback_window"]["earliest"], report["rollback_window"]["latest"]) == (0, 8 * INTERVAL - 1)
    assert len(_held(sinks[0].log)) <= CompactibleLog.COMPACTS_HELD
    ckpt, sinks = s.model()
    found = run_fsck(ckpt, sinks)
    assert not [f for f in found if f.severity == "error"], found
    assert len(_held(sinks[0].log)) <= CompactibleLog.COMPACTS_HELD

    with open(f"{s.out}/_spark_metadata/{3 * INTERVAL - 1}.compact", "ab") as f:  # an early compact, torn
        f.write(b'\n{"path":')
    ckpt, sinks = s.model()
    found = run_fsck(ckpt, sinks)
    assert any(f.path.endswith(f"_spark_metadata/{3 * INTERVAL - 1}.compact") and f.severity == "error"
               for f in found), found
