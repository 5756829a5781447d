"""The sink commands with real Spark: Spark writes a file sink (compaction interval 5, cleanup delay 0,
so it compacts and deletes its own plain log files), we compact, retain and clean orphans, and Spark's
readers see exactly the expected rows; the query then resumes, writes and compacts again.

The query is stateless, one input file per batch, so "exact" is simple to state: the sink holds every
row of every input file of the batches it should hold, once.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from pipelines.event_counts import event_rows, write_event_files
from tests.helpers import cli, cli_json, tree_snapshot
from tests.spark_runs import COMPACT_INTERVAL, run_stateless

SINK = ("--sink-compact-interval", str(COMPACT_INTERVAL))
FIRST, SECOND = 12, 12  # two runs, a ledger sync after each (as the Dagster asset does)


@pytest.fixture(scope="module")
def sink_run(spark, tmp_path_factory):
    base = str(tmp_path_factory.mktemp("sinks") / "run")
    for start, n in ((0, FIRST), (FIRST, SECOND)):
        write_event_files(os.path.join(base, "input"), start, start + n)
        run_stateless(spark, base)
        code, r = cli_json("ledger", "sync", f"{base}/checkpoint", "--sink", f"{base}/output", *SINK,
                           "--source-compact-interval", str(COMPACT_INTERVAL))
        assert code == 0, r
    shutil.copytree(base, base + ".pristine", symlinks=True)
    return base


class Run:
    def __init__(self, base: str):
        self.base = base
        shutil.rmtree(base)
        shutil.copytree(base + ".pristine", base, symlinks=True)

    @property
    def ckpt(self):
        return f"{self.base}/checkpoint"

    @property
    def out(self):
        return f"{self.base}/output"

    @property
    def log(self):
        return f"{self.out}/_spark_metadata"

    def batches(self) -> int:
        return 1 + max(int(n) for n in os.listdir(f"{self.ckpt}/commits") if n.isdigit())

    def stopped_long_ago(self) -> None:
        """Age the sink log as if the query stopped an hour ago: without its checkpoint, a fresh newest
        log file is all that tells a running query, and the commands rightly refuse then."""
        for name in os.listdir(self.log):
            os.utime(f"{self.log}/{name}", (time.time() - 3600, time.time() - 3600))

    def more(self, spark, n: int = 6) -> None:
        start = len([f for f in os.listdir(f"{self.base}/input") if f.endswith(".json")])
        write_event_files(f"{self.base}/input", start, start + n)
        run_stateless(spark, self.base)


@pytest.fixture
def run(sink_run):
    return Run(sink_run)


def rows(spark, out: str) -> list:
    return sorted(tuple(r) for r in spark.read.parquet(out).collect())


def expected(batches) -> list:
    """Batch b read input file b (maxFilesPerTrigger 1)."""
    return sorted((e["key"], e["value"]) for b in batches for e in event_rows(b))


def parquet_rows(spark, paths: list[str]) -> list:
    return sorted(tuple(r) for r in spark.read.parquet(*paths).collect()) if paths else []


def test_sink_files_is_exact_for_every_batch_and_refuses_without_a_ledger(spark, run):
    n = run.batches()
    assert not os.path.exists(f"{run.log}/0"), "the fixture must have let Spark delete early plain log files"
    for b in range(n):
        code, r = cli_json("sink", "files", run.out, "--batch", b, "--checkpoint", run.ckpt, *SINK)
        assert code == 0, r
        on_disk = os.path.exists(f"{run.log}/{b}") or os.path.exists(f"{run.log}/{b}.compact")
        assert r["source"] == "spark log" if os.path.exists(f"{run.log}/{b}") else True, (b, r["source"])
        assert on_disk or r["source"] == "batch ledger", (b, r["source"])
        # exact: what the listed files hold is exactly the rows of input file b
        assert parquet_rows(spark, [f["path"] for f in r["files"]]) == expected([b])
    shutil.rmtree(f"{run.base}/.checkpoint-ops")  # no ledger: what Spark compacted away is unknown
    code, out, err = cli("sink", "files", run.out, "--batch", 0, "--checkpoint", run.ckpt, *SINK)
    assert code == 1 and "unknown" in err and "compacted it into" in err and "Traceback" not in err
    code, r = cli_json("sink", "files", run.out, "--batch", n - 1, *SINK)  # Spark still knows the newest
    assert code == 0 and r["source"] == "spark log"


def test_compact_then_spark_reads_resumes_and_compacts_again(spark, run):
    before = rows(spark, run.out)
    assert before == expected(range(run.batches()))
    code, dry = cli_json("sink", "compact", run.out, "--checkpoint", run.ckpt, *SINK, "--dry-run")
    assert code == 0, dry
    code, r = cli_json("sink", "compact", run.out, "--checkpoint", run.ckpt, *SINK, "--yes")
    assert code == 0, r
    assert r["plan"]["plan_hash"] == dry["plan"]["plan_hash"]
    left = sorted(os.listdir(run.log))
    compacts = sorted(int(n.split(".")[0]) for n in left if n.endswith(".compact"))
    assert len(compacts) == 2 and all(int(n.split(".")[0]) > compacts[0] for n in left
                                      if n[0] != "." and not n.endswith(".compact"))
    assert rows(spark, run.out) == before
    code, f = cli_json("fsck", run.ckpt, "--sink", run.out, *SINK, "--source-compact-interval", str(COMPACT_INTERVAL))
    assert (code, f["findings"]) == (0, [])
    run.more(spark, 7)  # crosses the next compaction: Spark reads what we left and compacts after it
    assert rows(spark, run.out) == expected(range(run.batches()))
    assert any(int(n.split(".")[0]) > compacts[-1] for n in os.listdir(run.log) if n.endswith(".compact"))


def test_undo_of_a_compaction_restores_byte_for_byte(run):
    before = tree_snapshot(run.out)
    code, r = cli_json("sink", "compact", run.out, "--checkpoint", run.ckpt, *SINK, "--yes")
    assert code == 0 and r["plan"]["counts"]["delete"] > 0
    code, h = cli_json("history", run.ckpt)
    assert h["operations"][-1]["operation"] == "sink-compact"
    code, u = cli_json("undo", run.ckpt, "--yes")
    assert code == 0, u
    assert {p: d for p, (d, _) in tree_snapshot(run.out).items()} == {p: d for p, (d, _) in before.items()}


def test_compact_drop_missing_makes_readers_whole_and_undo_brings_the_entry_back(spark, run):
    """A data file of batch 7 deleted by hand: Spark's readers of the sink fail (FileNotFoundException). ``sink
    compact --drop-missing`` drops its entry (the plan says so and rewrites the compact file), readers then see
    exactly every other batch's rows, and the query resumes and compacts after it; undo brings the sink log back
    byte for byte. Without --drop-missing the compaction keeps the entry."""
    code, r = cli_json("sink", "files", run.out, "--batch", 7, "--checkpoint", run.ckpt, *SINK)
    assert code == 0 and len(r["files"]) == 1, r
    gone = r["files"][0]["path"].removeprefix("file://")
    os.remove(gone)
    with pytest.raises(Exception, match="(?i)FileNotFound|does not exist"):
        rows(spark, run.out)
    before = {path: digest for path, (digest, _) in tree_snapshot(run.out).items()}
    code, kept = cli_json("sink", "compact", run.out, "--checkpoint", run.ckpt, *SINK, "--dry-run")
    assert code == 0 and "dropped" not in json.dumps(kept["plan"]["summary"]), kept
    code, r = cli_json("sink", "compact", run.out, "--checkpoint", run.ckpt, *SINK, "--drop-missing", "--yes")
    assert code == 0, r
    assert "1 dropped" in json.dumps(r["plan"]), r["plan"]
    assert rows(spark, run.out) == expected(b for b in range(run.batches()) if b != 7)
    code, f = cli_json("fsck", run.ckpt, "--sink", run.out, *SINK, "--source-compact-interval", str(COMPACT_INTERVAL))
    still = [x for x in f["findings"] if x["path"].endswith(os.path.basename(gone))]  # in an older, kept compact file
    assert still and all("--drop-missing` rewrites the newest compact file only" in x["fix"] for x in still), f
    code, again = cli_json("sink", "compact", run.out, "--checkpoint", run.ckpt, *SINK, "--drop-missing", "--yes")
    assert code == 0 and not any(again["plan"]["counts"].values()), again  # nothing it can drop
    code, u = cli_json("undo", run.ckpt, "--yes")
    assert code == 0, u
    assert {path: digest for path, (digest, _) in tree_snapshot(run.out).items()} == before
    code, r = cli_json("sink", "compact", run.out, "--checkpoint", run.ckpt, *SINK, "--drop-missing", "--yes")
    assert code == 0, r
    run.more(spark, 7)  # crosses the next compaction: Spark reads what we left and compacts after it
    assert rows(spark, run.out) == expected(b for b in range(run.batches()) if b != 7)


def test_rollback_after_compaction_reaches_what_the_ledger_knows(spark, run):
    code, r = cli_json("sink", "compact", run.out, "--checkpoint", run.ckpt, *SINK, "--yes")
    assert code == 0, r
    target = FIRST + 2  # its plain sink log file is gone now: only the ledger knows the log as of it
    assert not os.path.exists(f"{run.log}/{target}")
    code, r = cli_json("rollback", run.ckpt, "--to-batch", target, "--sink", run.out, *SINK,
                       "--source-compact-interval", str(COMPACT_INTERVAL), "--yes")
    assert code == 0, r
    assert rows(spark, run.out) == expected(range(target + 1))
    run_stateless(spark, run.base)  # re-runs target+1 ..
    assert rows(spark, run.out) == expected(range(run.batches()))


@pytest.mark.parametrize("delete_files", [True, False], ids=["delete-files", "keep-files"])
def test_retain_drops_whole_batches(spark, run, delete_files):
    n = run.batches()
    keep_after = 9
    args = ["sink", "retain", run.out, "--checkpoint", run.ckpt, "--keep-after-batch", keep_after, *SINK, "--yes"]
    code, r = cli_json(*args, *(["--delete-files"] if delete_files else []))
    assert code == 0, r
    assert rows(spark, run.out) == expected(range(keep_after + 1, n))
    parquet = [f for f in os.listdir(run.out) if f.endswith(".parquet")]
    code, o = cli_json("sink", "orphans", run.out, "--min-age", "0s", *SINK)
    orphans = o["plan"]["summary"]["orphans"]
    assert orphans.startswith("0 files" if delete_files else f"{keep_after + 1} files"), orphans
    assert len(parquet) == (n - keep_after - 1 if delete_files else n)
    run.more(spark, 7)
    assert rows(spark, run.out) == expected(range(keep_after + 1, run.batches()))
    code, f = cli_json("fsck", run.ckpt, "--sink", run.out, *SINK, "--source-compact-interval", str(COMPACT_INTERVAL))
    assert code in (0, 1) and not [x for x in f["findings"] if x["severity"] == "error"], f


@pytest.mark.parametrize("target", [5, FIRST + 2], ids=["into-retained", "after-retained"])
def test_rollback_after_retain_then_spark_resumes_exactly(spark, run, target):
    """A rollback after ``sink retain``: to a batch retain dropped, or to one it kept. The sink keeps none of
    what retain dropped, and the batches after the target are Spark's to write again, once each."""
    n, keep_after = run.batches(), 9
    code, r = cli_json("sink", "retain", run.out, "--checkpoint", run.ckpt, "--keep-after-batch", keep_after, *SINK,
                       "--delete-files", "--yes")
    assert code == 0, r
    code, r = cli_json("rollback", run.ckpt, "--to-batch", target, "--sink", run.out, *SINK,
                       "--source-compact-interval", str(COMPACT_INTERVAL), "--yes")
    assert code == 0, r
    if target > keep_after:
        assert rows(spark, run.out) == expected(range(keep_after + 1, target + 1))
    code, f = cli_json("fsck", run.ckpt, "--sink", run.out, *SINK, "--source-compact-interval", str(COMPACT_INTERVAL))
    assert code == 0 and f["findings"] == [], f
    run_stateless(spark, run.base)  # re-runs target+1 .. n-1
    assert run.batches() == n
    # what retain kept up to the target stays; what it dropped after the target Spark writes again
    assert rows(spark, run.out) == expected(range(min(target, keep_after) + 1, n))


def test_retain_refuses_to_guess_without_a_ledger(run):
    shutil.rmtree(f"{run.base}/.checkpoint-ops")
    before = tree_snapshot(run.out)
    code, out, err = cli("sink", "retain", run.out, "--checkpoint", run.ckpt, "--keep-after-batch", 3, *SINK, "--yes")
    assert code == 1 and "no record attributes" in err and "--older-than" in err
    assert tree_snapshot(run.out) == before


def test_retain_refuses_to_drop_the_last_batch_which_would_hide_every_row(spark, run):
    last = run.batches() - 1
    before = tree_snapshot(run.out)
    for keep_after in (last + 90, last):
        code, r = cli_json("sink", "retain", run.out, "--checkpoint", run.ckpt, "--keep-after-batch", keep_after,
                           *SINK, "--yes")
        assert code == 1 and r["error"] == "RefusedError", r
        assert f"every batch left in the sink log (it ends at batch {last})" in r["problem"], r
        assert f"--keep-after-batch {last - 1}" in r["fix"] and "--force" in r["fix"], r
        assert tree_snapshot(run.out) == before
    assert rows(spark, run.out) == expected(range(last + 1))
    # what the refusal spares: applied on purpose, Spark's readers find no file of the output, though all are there
    code, r = cli_json("sink", "retain", run.out, "--checkpoint", run.ckpt, "--keep-after-batch", last, *SINK,
                       "--force", "--yes")
    assert code == 0, r
    with pytest.raises(Exception, match="UNABLE_TO_INFER_SCHEMA"):
        rows(spark, run.out)
    assert spark.read.schema("key STRING, value LONG").parquet(run.out).count() == 0
    assert {p for p in before if p.endswith(".parquet")} <= set(tree_snapshot(run.out))


def test_orphans_respect_the_safety_window(spark, run):
    parts = sorted(f for f in os.listdir(run.out) if f.endswith(".parquet"))
    old = f"{run.out}/part-00000-00000000-0000-0000-0000-00000000dead-c000.snappy.parquet"
    young = f"{run.out}/part-00000-00000000-0000-0000-0000-00000000beef-c000.snappy.parquet"
    shutil.copy(f"{run.out}/{parts[0]}", old)
    shutil.copy(f"{run.out}/{parts[0]}", young)
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    before = rows(spark, run.out)
    code, r = cli_json("sink", "orphans", run.out, "--min-age", "1h", "--delete", *SINK, "--yes")
    assert code == 1 and "looks active" in r["problem"]  # the newest log file is moments old
    run.stopped_long_ago()
    code, r = cli_json("sink", "orphans", run.out, "--min-age", "1h", "--delete", *SINK, "--yes")
    assert code == 0, r
    assert not os.path.exists(old) and os.path.exists(young)
    assert "1 younger than the safety window" in r["plan"]["summary"]["orphans"]
    assert rows(spark, run.out) == before
    code, u = cli_json("undo", run.out, "--yes")  # no checkpoint: the journal lives beside the output
    assert code == 0 and os.path.exists(old), u


def test_quarantine_moves_orphans(run, tmp_path):
    parts = sorted(f for f in os.listdir(run.out) if f.endswith(".parquet"))
    orphan = "part-00000-00000000-0000-0000-0000-00000000dead-c000.snappy.parquet"
    shutil.copy(f"{run.out}/{parts[0]}", f"{run.out}/{orphan}")
    os.utime(f"{run.out}/{orphan}", (time.time() - 7200, time.time() - 7200))
    q = tmp_path / "quarantine"
    run.stopped_long_ago()
    code, r = cli_json("sink", "orphans", run.out, "--quarantine", q, *SINK, "--yes")
    assert code == 0, r
    assert (q / orphan).exists() and not os.path.exists(f"{run.out}/{orphan}")


@pytest.mark.parametrize("damage", ["torn-compact", "gap", "ledger-disagrees"])
def test_bad_sink_input_is_refused_and_changes_nothing(run, damage):
    names = sorted(os.listdir(run.log))
    compacts = sorted((n for n in names if n.endswith(".compact")), key=lambda n: int(n.split(".")[0]))
    if damage == "torn-compact":
        victim = compacts[-1]
        open(f"{run.log}/{victim}", "wb").write(open(f"{run.log}/{victim}", "rb").read()[:200])
    elif damage == "gap":
        last = max(int(n.split(".")[0]) for n in names if n[0] != ".")
        victim = str(last - 1)
        os.remove(f"{run.log}/{victim}")
    else:  # the ledger says another file for a batch whose plain log file is still there
        plain = min(int(n) for n in names if n.isdigit())
        victim = "ledger"
        seg = f"{run.base}/.checkpoint-ops/checkpoint/ledger"
        entry = json.loads(open(f"{run.log}/{plain}").read().split("\n")[1])
        entry["path"] = entry["path"].replace("part-", "part-99999-not-")
        rec = {"batch": plain, "sinks": {run.out: {"entries": [json.dumps(entry, separators=(",", ":"))]}}}
        open(f"{seg}/29991231T000000.000000Z-sync-deadbeef.jsonl", "w").write(json.dumps(rec))
    before = tree_snapshot(run.out, run.ckpt)
    code, out, err = cli("sink", "compact", run.out, "--checkpoint", run.ckpt, *SINK, "--yes")
    assert code == 2, (out, err)
    assert victim in err and "Traceback" not in err
    assert tree_snapshot(run.out, run.ckpt) == before
