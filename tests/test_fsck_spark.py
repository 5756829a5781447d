"""fsck on real checkpoints: healthy ones pass; each corruption is found, named, and nothing changes."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from checkpoint_ops.storage.checksums import hadoop_crc_bytes
from tests.helpers import cli_json, tree_snapshot
from tests.spark_runs import COMPACT_INTERVAL

INTERVALS = ("--source-compact-interval", str(COMPACT_INTERVAL), "--sink-compact-interval", str(COMPACT_INTERVAL))


def fsck(run, *extra):
    return cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS, *extra)


def test_healthy_fixture_is_clean(run):
    code, r = fsck(run, "--deep")
    assert r["findings"] == [] and r["healthy"] is True
    assert code == 0


# Each corruption returns (expected code, expected path suffix).
def _last(run):
    return run.last_batch


def empty_offsets(run):
    p = os.path.join(run.checkpoint, "offsets", str(_last(run)))
    open(p, "wb").close()
    return "empty-log-file", f"offsets/{_last(run)}"


def truncated_offsets(run):
    p = os.path.join(run.checkpoint, "offsets", str(_last(run)))
    data = open(p, "rb").read()
    open(p, "wb").write(data[: len(data) - 5])
    return "truncated-log-file", f"offsets/{_last(run)}"


def non_json_commit(run):
    p = os.path.join(run.checkpoint, "commits", str(_last(run) - 2))
    open(p, "wb").write(b"v1\n<html>oops</html>")
    return "truncated-log-file", f"commits/{_last(run) - 2}"  # the only JSON line is the last line


def non_json_source_entry(run):
    log = os.path.join(run.checkpoint, "sources", "0")
    plain = sorted((n for n in os.listdir(log) if n.isdigit()), key=int)[-1]
    p = os.path.join(log, plain)
    open(p, "wb").write(b'v1\nnot json\n{"path":"x","timestamp":1,"batchId":1}')
    return "not-json", f"sources/0/{plain}"


def unknown_version(run):
    p = os.path.join(run.checkpoint, "commits", str(_last(run)))
    data = open(p, "rb").read()
    open(p, "wb").write(b"v99" + data[2:])
    return "unknown-version", f"commits/{_last(run)}"


def missing_metadata(run):
    os.remove(os.path.join(run.checkpoint, "metadata"))
    return "missing-metadata", "metadata"


def offsets_gap(run):
    os.remove(os.path.join(run.checkpoint, "offsets", str(_last(run) - 1)))
    return "offsets-gap", f"offsets/{_last(run) - 1}"


def commits_ahead(run):
    os.remove(os.path.join(run.checkpoint, "offsets", str(_last(run))))
    return "commits-ahead", f"commits/{_last(run)}"


def state_file_missing(run):
    """Every file of the version needed to restart (delta and snapshot, or changelog and zip) is gone."""
    v = _last(run) + 1
    d = os.path.join(run.checkpoint, "state", "0", "1")
    uid = None
    if run.flavour == "rocksdb_v2":
        commit = open(os.path.join(run.checkpoint, "commits", str(_last(run)))).read().split("\n")[1]
        uid = json.loads(commit)["stateUniqueIds"]["0"][1][0]
    stem = f"{v}_{uid}" if uid else str(v)
    removed = [n for n in os.listdir(d) if n.split(".")[0] == stem]
    assert removed
    for n in removed:
        os.remove(os.path.join(d, n))
    # the finding names the file the load needs first: the delta (HDFS) or changelog (RocksDB) of v
    return "state-missing", f"state/0/1/{stem}.{'delta' if run.flavour == 'hdfs' else 'changelog'}"


def stale_state(run):
    """What a naive rollback leaves: state files above the new last batch."""
    n = _last(run) - 3
    for sub in ("offsets", "commits"):
        for b in range(n + 1, _last(run) + 1):
            for name in (str(b), f".{b}.crc"):
                os.remove(os.path.join(run.checkpoint, sub, name))
    return "state-stale", None


def leftover_tmp(run):
    p = os.path.join(run.checkpoint, "offsets", f".{_last(run) + 1}.0b3c5d6e-aaaa-bbbb-cccc-123456789abc.tmp")
    open(p, "wb").write(b"v1\n{")
    return "temp-file", os.path.basename(p)


def stale_crc_same_size(run):
    """Content edited in place without updating the Hadoop sidecar (same length, so only bytes differ)."""
    p = os.path.join(run.checkpoint, "commits", str(_last(run)))
    data = bytearray(open(p, "rb").read())
    data[-2:-1] = b"1" if data[-2:-1] != b"1" else b"2"
    open(p, "wb").write(bytes(data))
    return "stale-crc", f"commits/.{_last(run)}.crc"


def stale_crc_other_size(run):
    p = os.path.join(run.checkpoint, "offsets", str(_last(run)))
    crc = os.path.join(run.checkpoint, "offsets", f".{_last(run)}.crc")
    open(crc, "wb").write(hadoop_crc_bytes(open(p, "rb").read() + b"x" * 600))
    return "stale-crc", f"offsets/.{_last(run)}.crc"


def orphan_crc(run):
    """A Hadoop sidecar whose file is gone (a hand deletion that missed the hidden ``.crc``)."""
    open(os.path.join(run.checkpoint, "commits", ".99999.crc"), "wb").write(hadoop_crc_bytes(b"v1\n{}"))
    return "orphan-crc", "commits/.99999.crc"


def orphan_crc_of_a_visible_tmp_name(run):
    """The sidecar of a missing ``notes.tmp``: not a temp file's (those are hidden, and reported with it)."""
    open(os.path.join(run.checkpoint, "offsets", ".notes.tmp.crc"), "wb").write(hadoop_crc_bytes(b"notes"))
    return "orphan-crc", "offsets/.notes.tmp.crc"


def orphan_crc_of_a_missing_temp(run):
    """The sidecar of a hidden temp file that is gone: no temp-file finding carries it any more."""
    name = f"..{_last(run) + 1}.0b3c5d6e-aaaa-bbbb-cccc-123456789abc.tmp.crc"
    open(os.path.join(run.checkpoint, "offsets", name), "wb").write(hadoop_crc_bytes(b""))
    return "orphan-crc", f"offsets/{name}"


def sink_log_gap(run):
    d = os.path.join(run.output, "_spark_metadata")
    latest = run.last_batch
    victim = str(latest - 1)  # a plain file between the latest compact and the latest batch
    assert os.path.exists(os.path.join(d, victim)) and (latest - 1 + 1) % COMPACT_INTERVAL != 0
    os.remove(os.path.join(d, victim))
    os.remove(os.path.join(d, f".{victim}.crc"))
    return "sink-log-gap", f"_spark_metadata/{victim}"


def sink_file_missing(run):
    parts = sorted(n for n in os.listdir(run.output) if n.startswith("part-"))
    os.remove(os.path.join(run.output, parts[0]))
    return "sink-file-missing", parts[0]


def sink_orphan_file(run):
    parts = sorted(n for n in os.listdir(run.output) if n.startswith("part-"))
    orphan = "part-00000-00000000-0000-0000-0000-000000000000-c000.snappy.parquet"
    shutil.copy(os.path.join(run.output, parts[0]), os.path.join(run.output, orphan))
    return "sink-orphan-file", orphan


CORRUPTIONS = [
    empty_offsets, truncated_offsets, non_json_commit, non_json_source_entry, unknown_version, missing_metadata,
    offsets_gap, commits_ahead, state_file_missing, stale_state, leftover_tmp, stale_crc_same_size,
    stale_crc_other_size, orphan_crc, orphan_crc_of_a_visible_tmp_name, orphan_crc_of_a_missing_temp,
    sink_log_gap, sink_file_missing, sink_orphan_file,
]


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__)
def test_corruption_is_found_and_nothing_changes(run, corrupt):
    code_expected, path_suffix = corrupt(run)
    before = tree_snapshot(run.checkpoint, run.output)
    code, r = fsck(run)
    assert tree_snapshot(run.checkpoint, run.output) == before, "fsck must not change anything"
    assert code == 1, r
    hits = [f for f in r["findings"] if f["code"] == code_expected]
    assert hits, f"expected {code_expected}, got {[(f['code'], f['path']) for f in r['findings']]}"
    f = hits[0]
    if path_suffix:
        assert any(h["path"].endswith(path_suffix) for h in hits), hits
    assert f["severity"] in ("error", "warning") and f["problem"] and f["fix"]


def test_an_interrupted_hadoop_write_is_temp_litter_not_a_stale_checksum(run):
    """``query.stop()`` during a log write through Hadoop's checksummed file system leaves the hidden temp
    file and its sidecar, both 0 bytes: ``sources/0/.10.<uuid>.tmp`` and ``..10.<uuid>.tmp.crc`` (seen in a
    review's real Spark runs; Spark never reads either and restarts over them). fsck called the sidecar a
    stale checksum (an error); it is the temp file's litter, one warning."""
    uid = "3f2e1d0c-aaaa-bbbb-cccc-123456789abc"
    batch = _last(run) + 1
    litter = [f"sources/0/.{batch}.{uid}.tmp", f"offsets/.{batch}.{uid}.tmp",
              f"state/0/0/.{batch + 1}.delta.{uid}.TID9.tmp"]
    for rel in litter:
        parent, name = os.path.split(os.path.join(run.checkpoint, rel))
        for made in (name, f".{name}.crc"):
            open(os.path.join(parent, made), "wb").close()
    code, r = fsck(run)
    found = sorted((f["severity"], f["code"], f["path"].rsplit("/", 1)[-1]) for f in r["findings"])
    assert found == sorted(("warning", "temp-file", rel.rsplit("/", 1)[-1]) for rel in litter), found
    assert code == 1  # warnings only


def test_naive_rollback_is_flagged_as_sink_ahead(run):
    stale_state(run)
    code, r = fsck(run)
    codes = {f["code"] for f in r["findings"]}
    assert {"state-stale", "sink-ahead"} <= codes
    ahead = next(f for f in r["findings"] if f["code"] == "sink-ahead")
    assert "rollback" in ahead["fix"] and "--sink" in ahead["fix"]


def test_unusable_input_exits_2(tmp_path):
    code, r = cli_json("fsck", str(tmp_path / "nothing-here"))
    assert code == 2 and "no such checkpoint" in r["problem"]
    (tmp_path / "random").mkdir()
    (tmp_path / "random" / "file.txt").write_text("hi")
    code, r = cli_json("fsck", str(tmp_path / "random"))
    assert code == 2 and "not a Spark checkpoint" in r["problem"]


def test_deep_fsck_names_the_hole_in_a_v2_lineage(spark_runs):
    """Version V loads through its changelog's lineage. With version V-1 gone (zip and changelog) and no
    zip left in the lineage, two things are wrong: the lineage has no snapshot, and V-1 has no file. The
    finding names V-1, the hole nearest the version Spark loads, whatever zips maintenance had uploaded
    below it (which one existed was timing: the corpus case once named a snapshot far below instead)."""
    run = spark_runs("rocksdb_v2")
    run.reset()
    try:
        last = run.last_batch
        version = last + 1
        d = os.path.join(run.checkpoint, "state", "0", "0")

        def uid_of(batch):
            doc = json.loads(open(os.path.join(run.checkpoint, "commits", str(batch))).read().split("\n")[1])
            return doc["stateUniqueIds"]["0"][0][0]

        hole = f"{version - 1}_{uid_of(last - 1)}"
        assert os.path.exists(os.path.join(d, f"{version}_{uid_of(last)}.changelog"))
        assert os.path.exists(os.path.join(d, f"{hole}.changelog"))
        for name in os.listdir(d):
            stem, _, ext = name.partition(".")
            if ext in ("zip", "zip.crc") or (stem == hole and not name.startswith(".")):
                os.remove(os.path.join(d, name))
        before = tree_snapshot(run.checkpoint, run.output)
        code, r = fsck(run, "--deep")
        assert tree_snapshot(run.checkpoint, run.output) == before
        assert code == 1, r
        missing = [f for f in r["findings"] if f["code"] == "state-missing" and "/state/0/0/" in f["path"]]
        assert missing and missing[0]["path"].endswith(f"state/0/0/{hole}.changelog"), missing
        assert "no snapshot" not in missing[0]["problem"], missing[0]
    finally:
        run.reset()
