"""The restart set with real Spark: what a rollback must refuse because Spark could not restart from it.

For each damage, two things are shown on the same checkpoint: the tool refuses the rollback (exit 2,
the file named, nothing changed), and Spark really fails when that file is damaged in the checkpoint
the rollback would have produced. Damage the rollback removes anyway is a repair: the plan says so,
and Spark resumes from the result exactly.
"""

from __future__ import annotations

import json
import os

import pytest

from checkpoint_ops.model.checkpoint import Checkpoint
from checkpoint_ops.restart import restart_set
from tests.helpers import cli, cli_json, tree_snapshot
from tests.test_rollback_spark import INTERVALS, exact, finish_and_read, log_offset_at, rollback, \
    target_before_last_compaction


def _source_entry_file(run, n: int) -> str:
    """The source-log file holding the entry of batch n's log offset (plain, or the compact at it)."""
    k = log_offset_at(run, n)
    d = os.path.join(run.checkpoint, "sources", "0")
    name = str(k) if os.path.exists(os.path.join(d, str(k))) else f"{k}.compact"
    assert os.path.exists(os.path.join(d, name))
    return f"sources/0/{name}"


def torn_source_entry(run, n):
    rel = _source_entry_file(run, n)
    open(os.path.join(run.checkpoint, rel), "wb").close()
    return rel, "Incomplete log file"


def truncated_previous_offsets(run, n):
    rel = f"offsets/{n - 1}"
    p = os.path.join(run.checkpoint, rel)
    data = open(p, "rb").read()
    cut = data.index(b'"conf"') + 3  # ends inside a field name of the metadata line
    open(p, "wb").write(data[:cut])
    return rel, "Unexpected end-of-input"


def garbage_metadata(run, n):
    open(os.path.join(run.checkpoint, "metadata"), "wb").write(b"<html>502 Bad Gateway</html>")
    return "metadata", "JsonParseException: Unexpected character ('<'"


SPARK_BREAKING = [torn_source_entry, truncated_previous_offsets, garbage_metadata]


@pytest.mark.parametrize("damage", SPARK_BREAKING, ids=lambda f: f.__name__)
def test_damage_in_the_restart_set_is_refused_and_would_break_spark(spark, run, damage):
    n = target_before_last_compaction(run)
    rel, spark_says = damage(run, n)
    before = tree_snapshot(run.checkpoint, run.output)
    for extra in (("--dry-run",), ("--yes",)):
        code, r = rollback(run, n, *extra)
        assert code == 2, r
        assert r["path"].endswith(rel) and rel in r["problem"] and r["fix"]
        assert tree_snapshot(run.checkpoint, run.output) == before, "a refused rollback changed something"
    code, i = cli_json("inspect", run.checkpoint, "--sink", run.output, *INTERVALS)
    w = i["rollback_window"]
    assert code == 0 and (w["earliest"] is None or w["earliest"] > n), w
    assert rel in (w["earliest_reason"] or "") + (w["latest_reason"] or "")

    # What Spark does with the checkpoint the rollback would have produced: roll back the intact
    # checkpoint, put the same damage into the result, and start the query.
    run.reset()
    code, r = rollback(run, n, "--yes")
    assert code == 0, r
    damage(run, n)
    with pytest.raises(Exception) as failure:
        finish_and_read(spark, run)
    if spark_says:
        assert spark_says in str(failure.value), str(failure.value)[:2000]


@pytest.mark.parametrize("flavour", ["rocksdb_v2"])
def test_damage_in_what_the_rollback_removes_is_a_repair(spark, run):
    """A torn newest commit is removed with the batches after N: the plan says so, and Spark resumes
    from the result exactly."""
    n = target_before_last_compaction(run)
    last = run.last_batch
    open(os.path.join(run.checkpoint, "commits", str(last)), "wb").close()
    code, dry = rollback(run, n, "--dry-run")
    assert code == 0, dry
    warning = f"commits/{last} is torn (0 bytes); it is removed with the batches after {n}"
    assert warning in dry["plan"]["warnings"]
    code, text_out, _ = cli("rollback", run.checkpoint, "--to-batch", n, "--sink", run.output, *INTERVALS, "--dry-run")
    assert code == 0 and warning in text_out
    code, r = rollback(run, n, "--yes")
    assert code == 0, r
    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    assert (code, f["findings"]) == (0, [])
    assert finish_and_read(spark, run) == exact(run)


def test_restart_set_names_what_spark_reads(run):
    """Every file of the set exists and is what the reference says Spark reads after batch n."""
    n = target_before_last_compaction(run)
    ckpt = Checkpoint.open(run.checkpoint, source_compact_interval=5)
    from checkpoint_ops.model.checkpoint import open_sink

    rs = restart_set(ckpt, n, [open_sink(run.output, compact_interval=5)])
    assert rs.ok, rs.damage
    by_role: dict[str, list[str]] = {}
    for f in rs.files:
        by_role.setdefault(f.role, []).append(f.rel)
    assert by_role["metadata"] == ["metadata"]
    assert sorted(by_role["offsets"]) == sorted([f"offsets/{n}", f"offsets/{n - 1}"])
    assert by_role["commits"] == [f"commits/{n}"]
    assert _source_entry_file(run, n) in by_role["source log"]
    assert any(r.endswith(".compact") for r in by_role["sink log"])
    sink_log = os.path.join(run.output, "_spark_metadata")
    listed = set()
    for name in os.listdir(sink_log):
        if name[0] != "." and int(name.split(".")[0]) <= n:
            for line in open(os.path.join(sink_log, name)).read().split("\n")[1:]:
                listed.add(os.path.basename(json.loads(line)["path"]))
    assert set(by_role["sink data"]) <= listed and by_role["sink data"]
    partitions = {r.split("/")[2] for r in by_role["state"]}
    assert partitions == {"0", "1"}
    v = n + 1
    if run.flavour == "rocksdb_v2":
        commit = json.loads(open(os.path.join(run.checkpoint, "commits", str(n))).read().split("\n")[1])
        uid = commit["stateUniqueIds"]["0"][0][0]
        assert any(r.startswith(f"state/0/0/{v}_{uid}.") for r in by_role["state"])
    else:
        assert any(os.path.basename(r).split(".")[0] == str(v) for r in by_role["state"] if "/0/0/" in r)
    for f in rs.files:
        root = run.checkpoint if f.root == "checkpoint" else run.output
        if f.origin == "disk":
            assert os.path.isfile(os.path.join(root, f.rel)), f


@pytest.mark.parametrize("flavour", ["hdfs", "rocksdb_v2"])
def test_a_state_directory_beyond_the_pinned_partitions_is_not_read(spark, run, tmp_path):
    """``state/0/2`` (empty: a hand ``mkdir``, or an object store's marker) where the offsets log pins 2 shuffle
    partitions: Spark loads partitions 0 and 1 only. fsck called it ``state-missing`` (version N+1 "loads from empty
    state but 1.delta is missing"), and backup create and rollback refused (exit 2)."""
    pinned = json.loads(open(os.path.join(run.checkpoint, "offsets", str(run.last_batch))).read().split("\n")[1])[
        "conf"]["spark.sql.shuffle.partitions"]
    beyond = os.path.join(run.checkpoint, "state", "0", str(pinned))
    assert not os.path.exists(beyond)
    os.mkdir(beyond)
    code, out, err = cli("inspect", run.checkpoint)
    # inspect named it "3 of the 2 partitions its metadata declares"
    assert code == 0 and (f"{pinned} partitions (and 1 directory beyond them, which Spark does not read)"
                          in out), out + err
    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    assert (code, f["findings"]) == (0, []), f
    code, b = cli_json("backup", "create", run.checkpoint, str(tmp_path / "dest"), "--sink", run.output)
    assert code == 0, b
    code, r = rollback(run, target_before_last_compaction(run), "--yes")
    assert code == 0, r
    assert finish_and_read(spark, run) == exact(run)
