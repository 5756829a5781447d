"""Misconfiguration refused before anything changes: the cases of the issue, on outputs real Spark wrote.

* Which files of an output are data: exactly what Spark's file index reads (Spark itself judges); a
  checkpoint kept inside its output is never an orphan, and Spark resumes from it afterwards.
* ``backup restore`` targets that overlap: exit 2, nothing written; a proper restore leaves the targets
  paired at their new locations, and Spark resumes there.
* Another query's output given as ``--sink``: every command that would change or judge the two together
  refuses (exit 1), nothing changes; once recorded, the records decide; the right pair still works.
* A sink log behind its checkpoint: an ``fsck`` error (the Dagster health check fails), orphan cleanup
  refuses, nothing suggests deleting data, and the suggested rollback plus reprocessing gives exactly the
  right output.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
from urllib.parse import unquote, urlsplit

from checkpoint_ops.model.sink import SinkOutput
from checkpoint_ops.pairing import PAIRING_FILE
from checkpoint_ops.storage import open_file_manager
from pipelines.event_counts import event_rows, write_event_files
from tests.helpers import cli, cli_json, tree_snapshot
from tests.spark_runs import COMPACT_INTERVAL, run_stateless
from tests.test_rollback_spark import INTERVALS, exact, finish_and_read

SINK = ("--sink-compact-interval", str(COMPACT_INTERVAL))
ORPHAN = "part-00000-00000000-0000-0000-0000-00000000dead-c000.snappy.parquet"


def rows(spark, out: str) -> list:
    """What Spark's readers see in the output (through its sink log)."""
    return sorted(tuple(r) for r in spark.read.parquet(out).collect())


def expected(files: int) -> list:
    """The stateless query copies (key, value) of every event: batch i read input file i."""
    return sorted((e["key"], e["value"]) for i in range(files) for e in event_rows(i))


def a_part_file(out: str) -> str:
    return sorted(glob.glob(os.path.join(out, "part-*.parquet")))[0]


def contents(*roots: str) -> dict:
    return {p: digest for p, (digest, _) in tree_snapshot(*roots).items()}


# ---- which files are data ------------------------------------------------------------------------------


def test_data_files_are_what_sparks_file_index_reads(spark, pairs, tmp_path):
    """Copies of a real data file under every kind of name Spark's listing treats specially: the files
    ``SinkOutput.data_files`` calls data are exactly the files Spark reads when it lists the directory."""
    src = a_part_file(pairs["a"].output)
    where = tmp_path / "listed"
    rels = ["part-0.parquet", ".hidden.parquet", "_underscore.parquet", "_a=b.parquet", ".a=b.parquet",
            "x=1/p.parquet", "_x=1/p.parquet", "_x=1/_y/p.parquet", "_x=1/.y/p.parquet", "_metadata/p.parquet",
            "_common_metadata_x/p.parquet", "leaf/_metadata", "leaf/_common_metadata", "leaf/x.parquet",
            "sub/ok/p.parquet", "sub/.hidden/p.parquet", "sub/_tmp/p.parquet", "p.parquet._COPYING_",
            "a._COPYING_/p.parquet"]
    for rel in rels:
        (where / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, where / rel)
    fm, root = open_file_manager(str(where))
    ours = set(SinkOutput(fm, root).data_files())

    from pyspark.sql import functions as F

    schema = spark.read.parquet(src).schema
    df = spark.read.schema(schema).option("recursiveFileLookup", "true").parquet(str(where))
    read = {os.path.relpath(unquote(urlsplit(r[0]).path), where)
            for r in df.select(F.input_file_name()).distinct().collect()}
    assert ours == read
    assert ours == {"part-0.parquet", "_a=b.parquet", "x=1/p.parquet", "_x=1/p.parquet", "_metadata/p.parquet",
                    "_common_metadata_x/p.parquet", "leaf/x.parquet", "sub/ok/p.parquet"}


def test_a_checkpoint_inside_its_output_is_never_an_orphan(spark, pairs):
    r = pairs["inside"]
    out, ckpt = r.output, r.checkpoint
    assert ckpt.startswith(out + "/") and os.path.exists(os.path.join(ckpt, "offsets", "0"))
    args = ("sink", "orphans", out, "--min-age", "0s", "--delete", *SINK)
    code, o = cli_json(*args, "--dry-run", "--force")
    assert code == 0, o
    assert o["plan"]["summary"]["orphans"].startswith("0 files") and o["plan"]["actions"] == [], o["plan"]
    code, f = cli_json("fsck", ckpt, "--sink", out, *INTERVALS)
    assert (code, f["findings"]) == (0, [])

    shutil.copy(a_part_file(out), os.path.join(out, ORPHAN))  # a real orphan beside it: found, and only it
    code, o = cli_json(*args, "--dry-run", "--force")
    assert o["plan"]["summary"]["orphan files"] == [ORPHAN] and {a["rel"] for a in o["plan"]["actions"]} == {ORPHAN}
    code, f = cli_json("fsck", ckpt, "--sink", out, *INTERVALS)
    assert [(x["code"], os.path.basename(x["path"])) for x in f["findings"]] == [("sink-orphan-file", ORPHAN)]

    kept = contents(ckpt)
    code, o = cli_json(*args, "--force", "--yes")
    assert code == 0, o
    assert not os.path.exists(os.path.join(out, ORPHAN)) and contents(ckpt) == kept
    assert rows(spark, out) == expected(r.files)
    r.run(spark, 3)  # Spark resumes from the checkpoint inside the output
    assert rows(spark, out) == expected(r.files)
    code, f = cli_json("fsck", ckpt, "--sink", out, *INTERVALS)
    assert (code, f["findings"]) == (0, [])


def test_every_orphan_is_listed_and_the_text_counts_the_rest_right(spark, pairs):
    """``summary["orphan files"]`` lists every orphan, and the text says how many it does not show (it listed 20,
    the last of them "... and 133 more", and the text said "and 13 more"; hostile review)."""
    out = pairs["inside"].output
    names = [ORPHAN.replace("dead", f"{i:04x}") for i in range(25)]
    for name in names:
        shutil.copy(a_part_file(out), os.path.join(out, name))
    try:
        args = ("sink", "orphans", out, "--min-age", "0s", *SINK)
        code, o = cli_json(*args)
        assert code == 0 and sorted(o["plan"]["summary"]["orphan files"]) == sorted(names), o["plan"]["summary"]
        code, text, err = cli(*args)
        assert code == 0 and "... and 17 more (--verbose or --json lists all)" in text, text
        code, text, err = cli(*args, "--verbose")
        assert code == 0 and all(n in text for n in names) and "more (--verbose" not in text, text
    finally:
        for name in names:
            os.remove(os.path.join(out, name))


# ---- restore targets --------------------------------------------------------------------------------------


def test_restore_refuses_overlapping_targets_and_pairs_the_targets(spark, pairs, tmp_path):
    r = pairs["inside"]
    dest = tmp_path / "dest"
    code, b = cli_json("backup", "create", r.checkpoint, dest, "--sink", r.output, *INTERVALS)
    assert code == 0, b
    t = tmp_path / "t"
    for target, sink_targets, how in [
        (t / "x", [t / "x"], "is the same place as"),
        (t / "x" / "checkpoint", [t / "x"], "lies inside"),  # the source's own layout
        (t / "x", [t / "x" / "out"], "contains"),
        (t / "x", [t / "o1", t / "o1" / "o2"], "contains"),
        (t / "x", [t / "o1", t / "o1"], "is the same place as"),
    ]:
        extra = [a for s in sink_targets for a in ("--sink-target", s)]
        for mode in ("--dry-run", "--yes"):
            code, out, err = cli("backup", "restore", dest, b["backup_id"], target, *extra, mode)
            assert code == 2 and how in err and "nothing was written" in err and "Traceback" not in err, (out, err)
            assert not t.exists(), "a refused restore wrote something"

    base = tmp_path / "restored"  # checkpoint, output and input side by side, as the query expects them
    shutil.copytree(r.input, base / "input")
    code, res = cli_json("backup", "restore", dest, b["backup_id"], base / "checkpoint", "--sink-target",
                         base / "output", "--relocate", f"{r.input}={base / 'input'}", "--yes")
    assert code == 0, res
    record = json.loads((base / "output" / PAIRING_FILE).read_text())
    assert (record["checkpoint"], record["sinks"], record["query_id"]) == \
        (str(base / "checkpoint"), [str(base / "output")], b["query_id"])
    ledger_records = [json.loads(open(p).read()) for p in
                      glob.glob(str(base / ".checkpoint-ops" / "checkpoint" / "ledger" / "pairing" / "*.json"))]
    assert [(x["checkpoint"], x["sinks"]) for x in ledger_records] == [(str(base / "checkpoint"), [str(base / "output")])]
    code, i = cli_json("inspect", base / "checkpoint", "--sink", base / "output", *INTERVALS)
    assert i["sinks"][0]["pairing"]["status"] == "paired"
    assert sorted(i["sinks"][0]["pairing"]["recorded"]) == ["ledger", "sink"]
    code, f = cli_json("fsck", base / "checkpoint", "--sink", base / "output", *INTERVALS)
    assert (code, f["findings"]) == (0, [])
    # the original output is not the restored checkpoint's: its own record says whose it is
    code, out, err = cli("rollback", base / "checkpoint", "--to-batch", 5, "--sink", r.output, *INTERVALS, "--dry-run")
    assert code == 1 and f"output of checkpoint {r.checkpoint}" in err, err
    write_event_files(str(base / "input"), r.files, r.files + 2)
    run_stateless(spark, str(base))
    assert rows(spark, str(base / "output")) == expected(r.files + 2)


# ---- another query's output --------------------------------------------------------------------------------


def test_another_querys_output_is_refused_before_anything_changes(spark, pairs, tmp_path):
    a, b = pairs["a"], pairs["b"]
    dest = tmp_path / "dest"
    everything = os.path.dirname(a.base)  # both queries' trees and their ledgers beside them
    before = tree_snapshot(everything)
    refused = {
        "rollback --dry-run": ["rollback", a.checkpoint, "--to-batch", 5, "--sink", b.output, *INTERVALS, "--dry-run"],
        "rollback --yes": ["rollback", a.checkpoint, "--to-batch", 5, "--sink", b.output, *INTERVALS, "--yes"],
        "ledger sync": ["ledger", "sync", a.checkpoint, "--sink", b.output, *INTERVALS],
        "backup create": ["backup", "create", a.checkpoint, dest, "--sink", b.output, *INTERVALS],
        "sink compact": ["sink", "compact", b.output, "--checkpoint", a.checkpoint, *SINK, "--yes"],
        "sink files": ["sink", "files", b.output, "--batch", 5, "--checkpoint", a.checkpoint, *SINK],
        "fsck": ["fsck", a.checkpoint, "--sink", b.output, *INTERVALS],
    }
    for name, args in refused.items():
        code, out, err = cli(*args, "--json")
        doc = json.loads(out)
        assert code == 1 and "Traceback" not in err, (name, out, err)
        if name == "fsck":
            assert [x["code"] for x in doc["findings"]] == ["sink-not-paired"], doc
            problem = doc["findings"][0]["problem"]
        else:
            assert doc["pairing"]["status"] == "not-lined-up" and doc["pairing"]["compared"], doc
            problem = doc["problem"]
        assert b.output in problem and a.checkpoint in problem and "do not line up" in problem, problem
        assert tree_snapshot(everything) == before, f"{name} changed something"
        assert not dest.exists()
    code, i = cli_json("inspect", a.checkpoint, "--sink", b.output, *INTERVALS)
    assert code == 0 and i["sinks"][0]["pairing"]["status"] == "not-lined-up"

    # recorded (each query's ledger sync): the records decide
    for q in (a, b):
        code, s = cli_json("ledger", "sync", q.checkpoint, "--sink", q.output, *INTERVALS)
        assert code == 0 and s["pairing"][0]["status"] == "paired", s
        assert sorted(s["pairing"][0]["recorded"]) == ["ledger", "sink"]
    code, out, err = cli("rollback", a.checkpoint, "--to-batch", 5, "--sink", b.output, *INTERVALS, "--dry-run")
    assert code == 1 and f"output of checkpoint {b.checkpoint}" in err, err
    # a backup with the other's output instead of its own: that is said first (it said a's own output was left out,
    # and its fix was to add it beside b's, which was then refused)
    code, out, err = cli("backup", "create", a.checkpoint, dest, "--sink", b.output, *INTERVALS)
    assert code == 1 and f"output of checkpoint {b.checkpoint}" in err and "not part of this backup" not in err, err
    assert not dest.exists()
    code, out, err = cli("ledger", "sync", a.checkpoint, "--sink", b.output, *INTERVALS, "--assume-paired")
    assert code == 1 and f"output of checkpoint {b.checkpoint}" in err, err  # never over the other's record
    for name in (PAIRING_FILE, f".{PAIRING_FILE}.crc"):  # the output's record lost: the ledger still tells
        os.remove(os.path.join(b.output, name))
    code, out, err = cli("rollback", a.checkpoint, "--to-batch", 5, "--sink", b.output, *INTERVALS, "--dry-run")
    assert code == 1 and f"records that its query writes {a.output}" in err, err

    # the right pair still works, and neither output loses or duplicates a row
    code, r = cli_json("rollback", a.checkpoint, "--to-batch", 5, "--sink", a.output, *INTERVALS, "--yes")
    assert code == 0, r
    a.run(spark, 2)
    assert rows(spark, a.output) == expected(a.files) and rows(spark, b.output) == expected(b.files)


def test_a_rollback_paired_by_batch_timing_alone_says_so_in_its_plan_until_a_record_decides(spark, pairs):
    """Two queries started together on one trigger from the same source line up with each other's outputs (the
    blind spot, pairing.py). A hostile review rolled one back with the other's output: exit 0, no word in the plan,
    and the other query's rows were lost. A pairing from batch timing alone is named in the plan's warnings (the
    dry run, the confirmation, ``--json``), with the command that records it; once recorded, no such warning."""
    a = pairs["a"]
    code, r = cli_json("rollback", a.checkpoint, "--to-batch", 5, "--sink", a.output, *INTERVALS, "--dry-run")
    assert code == 0, r
    (warning,) = [w for w in r["plan"]["warnings"] if "from batch timing alone" in w]
    assert a.output in warning and "started together" in warning, warning
    assert f"ledger sync {a.checkpoint} --sink {a.output}" in warning, warning
    code, out, err = cli("rollback", a.checkpoint, "--to-batch", 5, "--sink", a.output, *INTERVALS, "--dry-run")
    assert code == 0 and "from batch timing alone" in out + err, out

    code, s = cli_json("ledger", "sync", a.checkpoint, "--sink", a.output, *INTERVALS)
    assert code == 0 and s["pairing"][0]["status"] == "paired", s
    code, r = cli_json("rollback", a.checkpoint, "--to-batch", 5, "--sink", a.output, *INTERVALS, "--dry-run")
    assert code == 0 and not [w for w in r["plan"]["warnings"] if "timing alone" in w], r["plan"]["warnings"]


# ---- a sink behind its checkpoint ----------------------------------------------------------------------------


def test_sink_behind_is_an_error_and_the_suggested_rollback_restores_exact_output(spark, run, tmp_path):
    from dagster_checkpoint_ops.health import fsck_metadata
    from dagster_checkpoint_ops.query import StreamingQuery
    from dagster_checkpoint_ops.resources.checkpoint_files import CheckpointFileManagerResource

    last = run.last_batch
    log = os.path.join(run.output, "_spark_metadata")
    assert os.path.exists(os.path.join(log, str(last))), "the fixture ends on a plain sink log file"
    for name in (str(last), f".{last}.crc"):  # the log entry of the last batch is lost; commits/<last> is there
        os.remove(os.path.join(log, name))

    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    assert code == 1
    behind = [x for x in f["findings"] if x["code"] == "sink-behind"]
    assert len(behind) == 1 and behind[0]["severity"] == "error", f["findings"]
    assert behind[0]["path"].endswith(f"_spark_metadata/{last}")
    assert f"--to-batch {last - 1} --sink {run.output}" in behind[0]["fix"]
    orphans = [x for x in f["findings"] if x["code"] == "sink-orphan-file"]
    assert orphans and all(x["fix"].startswith("do not delete") for x in orphans)  # batch <last>'s data
    for x in f["findings"]:  # nothing suggests deleting data files (only warns not to)
        assert "delete" not in x["fix"].lower().replace("do not delete", ""), x

    query = StreamingQuery(name="events", build=lambda spark: None, checkpoint=run.checkpoint, sinks=[run.output])
    errors, _ = fsck_metadata(query, CheckpointFileManagerResource())  # what checkpoint_health_check judges
    assert "sink-behind" in {e.code for e in errors}

    code, s = cli_json("ledger", "sync", run.checkpoint, "--sink", run.output, *INTERVALS)
    assert code == 0, s  # records the pairing: orphan cleanup finds the checkpoint through it
    kept = contents(run.checkpoint, run.output)
    for how in (["--delete"], ["--quarantine", str(tmp_path / "q")]):
        code, out, err = cli("sink", "orphans", run.output, "--min-age", "0s", *how, "--force", "--yes", *SINK)
        assert code == 1 and f"batch {last} was committed" in err and "permanent" in err, (out, err)
        assert f"rollback {run.checkpoint} --to-batch {last - 1} --sink {run.output}" in err, err
        assert contents(run.checkpoint, run.output) == kept
    code, out, err = cli("rollback", run.checkpoint, "--to-batch", last, "--sink", run.output, *INTERVALS, "--yes")
    assert code == 1 and f"--to-batch {last - 1}" in err and contents(run.checkpoint, run.output) == kept, err

    code, r = cli_json("rollback", run.checkpoint, "--to-batch", last - 1, "--sink", run.output, *INTERVALS, "--yes")
    assert code == 0, r
    assert any(w.startswith(f"_spark_metadata/{last} is missing") for w in r["plan"]["warnings"]), r["plan"]["warnings"]
    assert finish_and_read(spark, run) == exact(run)
    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    assert (code, f["findings"]) == (0, [])
