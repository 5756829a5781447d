"""Rollbacks that need files Spark already compacted away: rebuilt, byte for byte, then resumed."""

from __future__ import annotations

import os

from pipelines.event_counts import write_event_files
from tests.helpers import cli, cli_json
from tests.spark_runs import COMPACT_INTERVAL, run_stateless
from tests.test_rollback_spark import INTERVALS, exact, finish_and_read, log_offset_at, target_before_last_compaction


def test_source_log_files_rebuilt_from_a_later_compact(spark, spark_runs):
    """Spark's source log can serve a deleted batch from a later compact (entries carry batchId);
    a rollback must write the files back under their names, identical to what Spark wrote."""
    run = spark_runs("hdfs")
    run.reset()
    n = target_before_last_compaction(run)
    k = log_offset_at(run, n)
    c = (k + 1) // COMPACT_INTERVAL * COMPACT_INTERVAL - 1  # the compaction the log state at k starts from
    log = os.path.join(run.checkpoint, "sources", "0")
    names = [f"{c}.compact", *(str(b) for b in range(c + 1, k + 1))]
    originals = {name: open(os.path.join(log, name), "rb").read() for name in names}
    # What Spark's own cleanup does with a shorter retention: every file below a compaction goes.
    for name in os.listdir(log):
        bid = name.lstrip(".").split(".")[0]
        if bid.isdigit() and int(bid) < c + COMPACT_INTERVAL:
            os.remove(os.path.join(log, name))
    assert f"{c + COMPACT_INTERVAL}.compact" in os.listdir(log)
    code, r = cli_json("rollback", run.checkpoint, "--to-batch", n, "--sink", run.output, *INTERVALS, "--yes")
    assert code == 0, r
    writes = {a["rel"] for a in r["plan"]["actions"] if a["kind"] == "write"}
    assert writes == {f"sources/0/{name}" for name in names}
    for name in names:
        assert open(os.path.join(log, name), "rb").read() == originals[name], name
    assert finish_and_read(spark, run) == exact(run)
    run.reset()


def _all_rows(spark, output):
    return sorted((r["key"], r["value"]) for r in spark.read.parquet(output).collect())


def _expected_rows(files):
    from pipelines.event_counts import event_rows

    return sorted((r["key"], r["value"]) for i in range(files) for r in event_rows(i))


def test_ledger_reaches_beyond_spark_window(spark, tmp_path):
    """A stateless query synced after every run: rollback far beyond what Spark kept is refused
    without the ledger's records and exact with them."""
    base = str(tmp_path / "stateless")
    inp, ckpt, out = (os.path.join(base, d) for d in ("input", "checkpoint", "output"))
    files = 0
    for _ in range(6):  # six runs of five files; the ledger is synced after each, like a runner would
        write_event_files(inp, files, files + 5)
        files += 5
        run_stateless(spark, base)
        code, s = cli_json("ledger", "sync", ckpt, "--sink", out, *INTERVALS)
        assert code == 0, s
    code, i = cli_json("inspect", ckpt, *INTERVALS)
    earliest_by_spark = i["offsets"]["first"] + 1
    target = 6
    assert target < earliest_by_spark - 5, "the target must be far outside Spark's own window"

    # offsets of a batch Spark purged: answered from the ledger, committed as the ledger recorded it
    code, o = cli_json("offsets", ckpt, "--batch", target, *INTERVALS)
    assert code == 0, o
    assert (o["recorded_in"], o["committed"], o["start_known"]) == ("ledger", True, True)
    code, text, _ = cli("offsets", ckpt, "--batch", str(target), *INTERVALS)
    assert code == 0 and f"Batch {target} (committed," in text and "as the batch ledger recorded it" in text
    code, newest = cli_json("offsets", ckpt, "--batch", i["last_committed_batch"], *INTERVALS)
    assert (newest["recorded_in"], newest["committed"]) == ("checkpoint", True)

    # The ledger is what makes it reachable: hide it and the rollback is refused.
    ops = os.path.join(base, ".checkpoint-ops", "checkpoint", "ledger")
    os.rename(ops, ops + ".hidden")
    code, r = cli_json("rollback", ckpt, "--to-batch", target, "--sink", out, *INTERVALS, "--dry-run")
    assert code == 1 and f"earliest reachable batch is {earliest_by_spark}" in r["problem"]
    code, o = cli_json("offsets", ckpt, "--batch", target, *INTERVALS)
    assert code == 2 and o["path"].endswith(f"offsets/{target}")
    os.rename(ops + ".hidden", ops)

    code, r = cli_json("rollback", ckpt, "--to-batch", target, "--sink", out, *INTERVALS, "--yes")
    assert code == 0, r
    writes = {a["rel"] for a in r["plan"]["actions"] if a["kind"] == "write"}
    assert {f"offsets/{target}", f"offsets/{target - 1}", f"commits/{target}"} <= writes
    assert any(w.startswith("sources/0/") for w in writes) and any(w.startswith("_spark_metadata/") for w in writes)
    code, f = cli_json("fsck", ckpt, "--sink", out, *INTERVALS)
    assert (code, f["findings"]) == (0, [])
    assert _all_rows(spark, out) == _expected_rows(target + 1)  # exactly batches 0..target remain
    run_stateless(spark, base)
    assert _all_rows(spark, out) == _expected_rows(files)  # every row exactly once


def test_ledger_sync_is_incremental(spark, tmp_path):
    base = str(tmp_path / "q")
    inp, ckpt, out = (os.path.join(base, d) for d in ("input", "checkpoint", "output"))
    write_event_files(inp, 0, 4)
    run_stateless(spark, base)
    code, first = cli_json("ledger", "sync", ckpt, "--sink", out)
    assert code == 0 and first["batches_recorded"] == 4
    code, again = cli_json("ledger", "sync", ckpt, "--sink", out)
    assert code == 0 and again["batches_recorded"] == 0 and again["segment"] is None
    code, text, _ = cli("ledger", "show", ckpt, "--batch", "2")
    assert code == 0 and "_spark_metadata" not in text and "part-" in text
