"""A query stopped between its file sink's commit of a batch and the batch's ``commits/`` file; and
Spark's judge (compat) on every state store.

Spark writes ``_spark_metadata/N`` before ``commits/N``; a crash, a kill or a ``stop()`` between the two
leaves a batch the sink logged and the checkpoint only planned. Spark restarts by re-running it, and the
file sink skips it (its rows are there). Spark is the judge of what follows, per state store:

* HDFS and RocksDB format V1 restart, and the output is exact: fsck and compat say nothing;
* RocksDB with ``checkpointFormatVersion=2`` fails every restart (``assertion failed: CheckpointInfo length:
  0``: the skipped batch ran no task to report its state checkpoint ids). fsck names it
  (``sink-ahead-of-commit``), compat says it fails at restart, and the fix both give, a rollback to the last
  commit with the sink, run as written, lets Spark resume with the exact output.

The stop is made by removing ``commits/N`` (and its ``.crc``) from a checkpoint Spark wrote: what Spark
leaves when it dies after the sink's commit, as its last act of the batch is that file.
"""

from __future__ import annotations

import os
import re
import shlex

import pytest

from checkpoint_ops.compat import FAILS, SILENT, check_compat
from checkpoint_ops.model import Checkpoint
from pipelines.event_counts import counts_writer, write_event_files
from tests.helpers import cli_json, tree_snapshot
from tests.spark_runs import FLAVOURS, SESSION_CONF, unload_state_stores
from tests.test_bad_input_corpus import remove_with_sidecars
from tests.test_rollback_spark import INTERVALS, exact, finish_and_read


def _stop_before_commit(run) -> int:
    """Remove the last batch's commit, as a stop after its sink commit leaves it; returns that batch."""
    last = run.last_batch
    os.remove(os.path.join(run.checkpoint, "commits", str(last)))
    os.remove(os.path.join(run.checkpoint, "commits", f".{last}.crc"))
    os.utime(os.path.join(run.checkpoint, "offsets", str(last)))  # planned moments before the stop
    assert str(last) in os.listdir(os.path.join(run.output, "_spark_metadata")), "the sink must have logged it"
    return last


def _compat(spark, run):
    for key, value in {**SESSION_CONF, **FLAVOURS[run.flavour]}.items():
        if key.startswith("spark.sql."):
            spark.conf.set(key, value)
    return check_compat(Checkpoint.open(run.checkpoint), spark, lambda s: counts_writer(
        s, run.input, run.output).option("checkpointLocation", run.checkpoint).trigger(availableNow=True))


def test_a_stop_between_the_sink_commit_and_the_commit_log(spark, run):
    stopped = _stop_before_commit(run)
    before = tree_snapshot(run.base)
    code, report = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    findings = [f for f in report["findings"] if f["code"] == "sink-ahead-of-commit"]
    compat = _compat(spark, run)
    assert tree_snapshot(run.base) == before, "fsck or compat changed something"
    refused = [d for d in compat.differences if d.aspect == "sink" and d.verdict == FAILS]
    assert compat.spark_restarts is True, compat.render()  # the judge restarts from the last commit

    if run.flavour != "rocksdb_v2":
        assert findings == [], findings
        assert refused == [], compat.render()
        assert finish_and_read(spark, run) == exact(run)
        return

    assert code != 0 and len(findings) == 1 and findings[0]["severity"] == "error", report
    (finding,) = findings
    assert finding["path"].endswith(f"_spark_metadata/{stopped}"), finding
    assert f"holds batch {stopped}" in finding["problem"] and "CheckpointInfo length: 0" in finding["problem"]
    command = re.search(r"`(checkpoint-ops rollback [^`]+)`", finding["fix"]).group(1)
    assert command == f"checkpoint-ops rollback {run.checkpoint} --to-batch {stopped - 1} --sink {run.output}"
    assert len(refused) == 1 and not compat.compatible, compat.render()
    assert command in refused[0].fix and refused[0].rollback_to == stopped - 1, refused[0]

    # what fsck and compat say is what Spark does: the restart fails, and the checkpoint is as before
    with pytest.raises(Exception, match="CheckpointInfo length: 0"):
        run.run_query(spark)
    unload_state_stores(spark)
    code, again = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    assert [f["code"] for f in again["findings"] if f["severity"] == "error"] == ["sink-ahead-of-commit"], again

    # the fix, with the compact intervals of this test's session, then an exact resume; offsets/{stopped} was
    # written moments ago, so the rollback first refuses as if a batch were running (activity.py), then --force
    code, refusal = cli_json(*shlex.split(command)[1:], *INTERVALS, "--yes")
    assert code != 0 and "probably running" in refusal["problem"] and "--force" in refusal["fix"], refusal
    code, applied = cli_json(*shlex.split(command)[1:], *INTERVALS, "--yes", "--force")
    assert code == 0 and applied["result"]["status"] == "applied", applied
    code, after = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    assert (code, after["findings"]) == (0, []), after
    assert finish_and_read(spark, run) == exact(run)



def test_spark_judges_an_unchanged_query_restartable_on_every_state_store(spark, run):
    """The judge's copy holds what Spark loads: with RocksDB, the SST files its checkpoint zips name."""
    before = tree_snapshot(run.base)
    compat = _compat(spark, run)
    assert tree_snapshot(run.base) == before, "compat changed something"
    assert compat.spark_restarts is True, compat.render()
    assert compat.of(FAILS) == [] and compat.of(SILENT) == [], compat.render()


def test_a_first_batch_stopped_after_its_sink_commit_on_format_v2(spark, tmp_path):
    """Nothing committed: no rollback applies, and fsck and compat say so (Spark fails the restart here too)."""
    for key, value in {**SESSION_CONF, **FLAVOURS["rocksdb_v2"]}.items():
        if key.startswith("spark.sql."):
            spark.conf.set(key, value)
    inp, out, ckpt = (str(tmp_path / name) for name in ("input", "output", "checkpoint"))
    write_event_files(inp, 0, 2)

    def writer(session):
        return counts_writer(session, inp, out).option("checkpointLocation", ckpt).trigger(once=True)

    writer(spark).start().awaitTermination()
    unload_state_stores(spark)
    assert sorted(n for n in os.listdir(f"{ckpt}/commits") if n.isdigit()) == ["0"]
    os.remove(f"{ckpt}/commits/0")
    os.remove(f"{ckpt}/commits/.0.crc")

    code, report = cli_json("fsck", ckpt, "--sink", out)
    (finding,) = [f for f in report["findings"] if f["code"] == "sink-ahead-of-commit"]
    assert code != 0 and "holds batch 0" in finding["problem"], finding
    assert "no rollback applies" in finding["fix"] and "start the query afresh" in finding["fix"], finding
    compat = check_compat(Checkpoint.open(ckpt), spark, writer)
    (refused,) = compat.of(FAILS)
    assert refused.aspect == "sink" and "no rollback applies" in refused.fix and not compat.compatible
    assert refused.rollback_to is None and refused.fix in refused.effect

    with pytest.raises(Exception, match="CheckpointInfo length: 0"):
        writer(spark).start().awaitTermination()
    unload_state_stores(spark)


@pytest.mark.parametrize("flavour", ["rocksdb_v2"])
def test_only_the_shape_a_stop_after_the_sink_commit_leaves_is_named(run):
    """Other shapes are other findings (commits behind, a damaged commit), whose fixes differ."""
    last = run.last_batch
    commits = os.path.join(run.checkpoint, "commits")

    def ahead():
        code, report = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
        return [f for f in report["findings"] if f["code"] == "sink-ahead-of-commit"], report

    remove_with_sidecars(os.path.join(commits, str(last)))
    found, _ = ahead()
    assert len(found) == 1, found
    remove_with_sidecars(os.path.join(commits, str(last - 1)))  # two batches uncommitted: commits behind
    found, report = ahead()
    assert found == [] and "commits-behind" in {f["code"] for f in report["findings"]}, report
    run.reset()
    remove_with_sidecars(os.path.join(commits, str(last)))
    with open(os.path.join(commits, str(last - 1)), "wb") as f:  # the commit to roll back to is damaged
        f.write(b"not a commit")
    remove_with_sidecars(os.path.join(commits, f".{last - 1}.crc"))
    found, report = ahead()
    assert found == [] and any(f["severity"] == "error" and f["path"].endswith(f"commits/{last - 1}")
                               for f in report["findings"]), report


def test_the_fix_command_survives_spaces_in_paths():
    from checkpoint_ops.lag import SinkAheadOfCommits

    fix = SinkAheadOfCommits("/data/my checkpoints/q", "s3://bucket/out put", 30, 31).fix
    command = re.search(r"`(checkpoint-ops rollback [^`]+)`", fix).group(1)
    assert shlex.split(command)[1:] == ["rollback", "/data/my checkpoints/q", "--to-batch", "30", "--sink",
                                        "s3://bucket/out put"]


@pytest.mark.parametrize("flavour", ["rocksdb_v2"])
def test_the_judges_copy_refuses_a_zip_whose_metadata_names_its_ssts_in_a_shape_rocksdb_never_writes(spark, run):
    """Unusable input, naming the zip, not a TypeError (nor a zip taken to name no SST files)."""
    import json
    import zipfile

    from checkpoint_ops.errors import BadInputError

    store = os.path.join(run.checkpoint, "state", "0", "0")
    newest_zip = sorted((n for n in os.listdir(store) if n.endswith(".zip")), key=lambda n: int(n.split("_")[0]))[-1]
    path = os.path.join(store, newest_zip)
    with zipfile.ZipFile(path) as z:
        entries = {name: z.read(name) for name in z.namelist()}
    entries["metadata"] = b"v1\n" + json.dumps({"sstFiles": None, "numKeys": 1}).encode()
    remove_with_sidecars(path)
    with zipfile.ZipFile(path, "w") as z:
        for name, content in entries.items():
            z.writestr(name, content)
    with pytest.raises(BadInputError, match="not a readable RocksDB checkpoint zip") as refused:
        _compat(spark, run)
    assert refused.value.path.endswith(newest_zip), refused.value.path
