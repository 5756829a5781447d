"""After ``sink retain``, the batch ledger still records what every batch wrote (history: a rollback rebuilds
sink log files from it) while the log no longer holds the batches retain dropped. What compares the two
(``sink compact``'s check before it deletes plain files, the rollback window fsck and inspect judge, a
rollback's rebuild of a log file Spark deleted) judges the entries the log still holds: retain then
compact, the maintenance the Dagster schedule runs, is not refused, fsck is clean, and a rollback does not
bring back what retain dropped; a ledger that names other files is still refused. Fast tier: a synthetic
checkpoint and file sink in Spark's formats (benchmarks/synthetic.py, tests/synthetic_sink.py), no Spark."""

from __future__ import annotations

import json
import os
import shutil
import time

from benchmarks import synthetic
from tests.helpers import cli, cli_json, tree_snapshot
from tests.synthetic_sink import write_sink

SINK = ("--sink-compact-interval", "5")


def _retained(tmp_path, delete_files: bool = True) -> tuple[str, str, dict[int, str]]:
    """A checkpoint of 24 batches and its sink (compact every 5), the ledger synced, the log files below
    9.compact deleted as Spark's cleanup does, then batches 0..15 retained away."""
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    synthetic.write_local(ckpt, batches=24, partitions=1, retain_state=24)
    written = write_sink(out, 24, compact_interval=5)
    code, r = cli_json("ledger", "sync", ckpt, "--sink", out, *SINK)
    assert code == 0, r
    for name in os.listdir(f"{out}/_spark_metadata"):
        if int(name.lstrip(".").split(".")[0]) < 9:
            os.remove(f"{out}/_spark_metadata/{name}")
    code, r = cli_json("sink", "retain", out, "--checkpoint", ckpt, "--keep-after-batch", "15", *SINK, "--yes",
                       *(["--delete-files"] if delete_files else []))
    assert code == 0, r
    return ckpt, out, written


def test_compact_after_retain_is_not_refused_and_fsck_stays_clean(tmp_path):
    ckpt, out, written = _retained(tmp_path)
    assert not any(os.path.exists(written[b]) for b in range(16))

    code, r = cli_json("sink", "compact", out, "--checkpoint", ckpt, *SINK, "--dry-run")
    assert code == 0, r  # before: exit 2, "the batch ledger disagrees with _spark_metadata/10"
    code, r = cli_json("fsck", ckpt, "--sink", out, *SINK)
    assert code == 0 and r["findings"] == [], r  # before: window-cut, "listed in the sink log (_spark_metadata/5)"

    code, r = cli_json("sink", "compact", out, "--checkpoint", ckpt, *SINK, "--yes")
    assert code == 0, r
    assert not os.path.exists(f"{out}/_spark_metadata/10")
    code, r = cli_json("fsck", ckpt, "--sink", out, *SINK)
    assert code == 0 and r["findings"] == [], r
    code, r = cli_json("inspect", ckpt, "--sink", out, *SINK)
    assert code == 0 and r["rollback_window"]["earliest"] == 0, r["rollback_window"]

    # a rollback into the retained batches rebuilds the log files Spark deleted without what retain dropped
    code, r = cli_json("rollback", ckpt, "--to-batch", "7", "--sink", out, *SINK, "--yes")
    assert code == 0, r
    for name in ("4.compact", "5", "6", "7"):
        assert open(f"{out}/_spark_metadata/{name}").read() == "v1", name
    code, r = cli_json("fsck", ckpt, "--sink", out, *SINK)
    assert code == 0 and r["findings"] == [], r


def test_compact_after_retain_keeping_data_files_brings_nothing_back(tmp_path):
    ckpt, out, written = _retained(tmp_path, delete_files=False)
    code, r = cli_json("sink", "compact", out, "--checkpoint", ckpt, *SINK, "--yes")
    assert code == 0, r
    code, r = cli_json("sink", "files", out, "--checkpoint", ckpt, "--batch", "12")  # the ledger keeps history
    assert code == 0 and [f["path"] for f in r["files"]] == [f"file://{written[12]}"], r
    code, r = cli_json("rollback", ckpt, "--to-batch", "12", "--sink", out, *SINK, "--yes")
    assert code == 0, r
    assert open(f"{out}/_spark_metadata/12").read() == "v1"  # rebuilt from the ledger: batch 12 stays dropped
    assert os.path.exists(written[12])  # its data file was kept: `sink orphans` finds it


def _ledger_says(ckpt: str, out: str, batch: int, path: str) -> None:
    entry = json.loads(open(f"{out}/_spark_metadata/19.compact").read().split("\n")[1])
    entry["path"] = path
    rec = {"batch": batch, "sinks": {out: {"entries": [json.dumps(entry, separators=(",", ":"))]}}}
    seg = os.path.join(os.path.dirname(ckpt), ".checkpoint-ops", "ckpt", "ledger")
    with open(f"{seg}/29991231T000000.000000Z-sync-deadbeef.jsonl", "w") as f:
        f.write(json.dumps(rec))


def test_a_ledger_that_disagrees_is_still_refused_after_retain(tmp_path):
    ckpt, out, written = _retained(tmp_path)
    _ledger_says(ckpt, out, 17, f"file://{out}/part-99999-not-written-c000.json")  # a batch retain kept
    before = tree_snapshot(out, ckpt)
    code, _, err = cli("sink", "compact", out, "--checkpoint", ckpt, *SINK, "--yes")
    assert code == 2 and "disagrees with _spark_metadata/17" in err, err
    assert tree_snapshot(out, ckpt) == before


def test_a_ledger_naming_a_live_file_for_a_retained_batch_is_refused(tmp_path):
    ckpt, out, written = _retained(tmp_path)
    _ledger_says(ckpt, out, 12, f"file://{written[20]}")  # batch 20's file, which readers see, for batch 12
    before = tree_snapshot(out, ckpt)
    code, _, err = cli("sink", "compact", out, "--checkpoint", ckpt, *SINK, "--yes")
    assert code == 2 and "disagrees with _spark_metadata/12" in err, err
    assert tree_snapshot(out, ckpt) == before


def test_compacting_a_paired_output_without_its_checkpoint_is_refused_and_an_unpaired_one_warns(tmp_path):
    """``sink compact OUT`` without ``--checkpoint`` records the batches whose log files go in a ledger beside
    the output, where the checkpoint's rollback never looks: its window shrank for good, and `ledger sync` could
    not bring it back (a hostile review). An output whose pairing record names its checkpoint is refused,
    naming the flag and the checkpoint, with nothing changed; an output nothing pairs yet is compacted with a
    warning that says so. With the checkpoint, the rollback still reaches every batch."""
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    synthetic.write_local(ckpt, batches=24, partitions=1, retain_state=24)
    write_sink(out, 24, compact_interval=5)
    an_hour_ago = time.time() - 3600  # written long ago: no query looks active on the output
    for d, _, names in os.walk(out):
        for n in names:
            os.utime(os.path.join(d, n), (an_hour_ago, an_hour_ago))
    code, r = cli_json("sink", "compact", out, *SINK, "--dry-run")  # nothing pairs them yet
    assert code == 0, r
    (warning,) = [w for w in r["plan"]["warnings"] if w.startswith("no checkpoint given")]
    assert "batches 0..18" in warning and "--checkpoint CHECKPOINT" in warning, warning

    code, r = cli_json("ledger", "sync", ckpt, "--sink", out, *SINK)  # records the pairing on both sides
    assert code == 0, r
    before = tree_snapshot(ckpt, out)
    code, r = cli_json("sink", "compact", out, *SINK, "--yes")
    assert code == 1 and r["error"] == "RefusedError", r
    assert f"file sink of checkpoint {ckpt}" in r["problem"] and f"--checkpoint {ckpt}" in r["fix"], r
    assert tree_snapshot(ckpt, out) == before

    link = str(tmp_path / "out-link")  # the same output through a symbolic link: still its checkpoint's
    os.symlink(out, link)
    code, r = cli_json("sink", "compact", link, *SINK, "--yes")
    assert code == 1 and f"file sink of checkpoint {ckpt}" in r["problem"], r
    assert tree_snapshot(ckpt, out) == before

    # the query moved to a copy of its checkpoint: the fix says to pass the copy, which names the stale record
    copy = str(tmp_path / "ckpt-copy")
    shutil.copytree(ckpt, copy)
    assert "pass the copy with --checkpoint" in r["fix"], r
    code, r = cli_json("sink", "compact", out, "--checkpoint", copy, *SINK, "--yes")
    assert code != 0 and "pairing.json" in r["fix"] and f"checkpoint {ckpt}" in r["problem"], r
    assert tree_snapshot(ckpt, out) == before

    code, r = cli_json("sink", "compact", out, "--checkpoint", ckpt, *SINK, "--yes")
    assert code == 0 and not [w for w in r["plan"]["warnings"] if w.startswith("no checkpoint given")], r
    code, r = cli_json("rollback", ckpt, "--to-batch", "3", "--sink", out, *SINK, "--dry-run")
    assert code == 0, r  # the checkpoint's ledger kept batches 0..18 in its reach


def test_retain_older_than_counts_and_deletes_what_no_record_attributes(tmp_path):
    """Entries of a log Spark compacted before any ledger sync are attributed to no batch; ``--older-than``
    judges them by their modificationTime. The plan dropped them from every log file but counted none of them
    ("0 batches, 0 entries") and, with ``--delete-files``, left their data files behind for ``sink orphans``
    (a hostile review). It now counts them, says how they were judged, and deletes their files."""
    from checkpoint_ops.sinklog import apply, open_context, plan_orphans, plan_retain
    from tests.synthetic_sink import FIRST_BATCH_MS

    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    synthetic.write_local(ckpt, batches=12, partitions=1, retain_state=12)
    written = write_sink(out, 12, compact_interval=5)  # 4.compact, 9.compact; 10 and 11 plain
    for name in os.listdir(f"{out}/_spark_metadata"):
        if name != "9.compact" and int(name.split(".")[0]) < 10:
            os.remove(f"{out}/_spark_metadata/{name}")  # Spark's cleanup: batches 0..9 only in 9.compact now
    # batch b's entry was stamped FIRST_BATCH_MS + b s + 0.5 s: a cutoff at + 4.6 s drops the entries of 0..4
    now = (FIRST_BATCH_MS + 4_600) / 1000 + 3600
    ctx = open_context(out, ckpt, compact_interval=5, data=True)  # as `sink retain --delete-files` opens it
    plan = plan_retain(ctx, older_than_s=3600, now=now, delete_files=True, stage=True)
    summary = plan.summary["retain"]
    assert "0 batches, 5 entries (5 of them attributed to no batch by any record, dropped by their " \
           "modificationTime), 5 data files deleted" in summary, summary
    deleted = {a.rel for a in plan.actions if a.kind == "delete"}
    assert deleted == {os.path.relpath(written[b], out) for b in range(5)}, deleted
    apply(ctx, plan)
    assert not any(os.path.exists(written[b]) for b in range(5))
    assert all(os.path.exists(written[b]) for b in range(5, 12))
    with open(f"{out}/_spark_metadata/9.compact") as f:
        assert [json.loads(line)["path"] for line in f.read().split("\n")[1:]] == \
            [f"file://{written[b]}" for b in range(5, 10)]
    orphans = plan_orphans(open_context(out, ckpt, compact_interval=5, data=True), min_age_s=0)
    assert orphans.summary["orphans"].startswith("0 files"), orphans.summary


def test_fsck_after_a_plain_retain_names_retain_and_shows_the_kept_files_once(tmp_path):
    """``sink retain`` without ``--delete-files`` keeps the data files of the batches it drops: fsck's
    ``sink-orphan-file`` warning (one per file) blamed a failed or rolled-back batch, and the text repeated the
    same problem and fix for each of the 16 files. It names retain now, and the text shows the warning once with
    the other files after it (``--json`` keeps one finding per file)."""
    ckpt, out, written = _retained(tmp_path, delete_files=False)
    code, r = cli_json("fsck", ckpt, "--sink", out, *SINK)
    orphans = [f for f in r["findings"] if f["code"] == "sink-orphan-file"]
    assert code == 1 and len(orphans) == 16 and len(r["findings"]) == 16, r
    assert "`sink retain`" in orphans[0]["problem"], orphans[0]
    code, text, err = cli("fsck", ckpt, "--sink", out, *SINK)
    assert code == 1, err
    assert text.count("sink-orphan-file") == 1 and text.count("fix:") == 1, text
    assert "the same for 15 more: " in text and "and 10 more (--json lists every one)" in text, text
