"""A Hadoop ``.X.crc`` sidecar that does not match ``X`` (a file edited in place, as an editor does, or a sidecar
copied from elsewhere): what Spark 4.3 does with it, and what we say.

Spark does not check the sidecars of checkpoint files (``metadata``, offsets, commits, source logs, operator
metadata, state schemas) or of a sink log when it reads them: with every one of them wrong, it restarts and writes
exactly the expected output. fsck called each an error ("Spark's reads fail
with ChecksumException"), the restart set counted it as damage, and so ``rollback`` refused (exit 2) and the
window and the health check stopped there, over a checkpoint Spark restarts from. They are warnings now, and
rollback goes through. Spark's readers of a sink do check a **data file**'s sidecar (its parquet reader fails),
and RocksDB's load checks its files' (it falls back to older snapshots, then fails where the changelogs before
them are purged): those stay errors, and a RocksDB state file's stays damage in the restart set. The HDFS store's
load does not check them: warnings there.
"""

from __future__ import annotations

import os

import pytest

from tests.helpers import cli_json
from tests.test_rollback_spark import INTERVALS, exact, finish_and_read, rollback, target_before_last_compaction


def _flip_sidecars(top: str, state_files: bool = False) -> list[str]:
    """Make every Hadoop sidecar (hidden ``.X.crc``) under ``top`` wrong (its last checksum byte flipped): the
    relative paths of the files they belong to. Under ``state/`` only those of operator metadata and state schemas,
    or (``state_files``) only those of state files and SSTs."""
    flipped = []
    for parent, _, names in os.walk(top):
        rel_parent = os.path.relpath(parent, top)
        in_state = rel_parent == "state" or rel_parent.startswith("state/")
        described = "_metadata" in rel_parent or "_stateSchema" in rel_parent
        if state_files != (in_state and not described):
            continue
        for name in names:
            if name.startswith(".") and name.endswith(".crc") and not name.endswith(".tmp.crc"):
                path = os.path.join(parent, name)
                data = bytearray(open(path, "rb").read())
                data[-1] ^= 0xFF
                open(path, "wb").write(bytes(data))
                flipped.append(os.path.relpath(os.path.join(parent, name[1:-4]), top))
    return flipped


def test_spark_restarts_over_wrong_sidecars_of_every_checkpoint_file_and_rollback_goes_through(spark, run):
    n = target_before_last_compaction(run)
    flipped = _flip_sidecars(run.checkpoint) + _flip_sidecars(os.path.join(run.output, "_spark_metadata"))
    kinds = {rel.split("/")[0] for rel in flipped}
    assert {"metadata", "offsets", "commits", "sources", "state"} <= kinds, kinds  # state: its metadata, schemas
    assert any("/_metadata/" in rel for rel in flipped), "no operator metadata or schema sidecar"
    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, "--deep", *INTERVALS)
    assert code == 1, f
    assert {(x["severity"], x["code"]) for x in f["findings"]} == {("warning", "stale-crc")}, f
    named = {x["path"] for x in f["findings"]}
    for rel in ("metadata", f"offsets/{run.last_batch}", f"commits/{run.last_batch}"):
        assert any(p.endswith("/" + os.path.join(os.path.dirname(rel), "." + os.path.basename(rel) + ".crc"))
                   for p in named), (rel, named)
    assert all("if" in x["fix"] and "restore both from a backup" in x["fix"] for x in f["findings"]), f
    code, i = cli_json("inspect", run.checkpoint, "--sink", run.output, *INTERVALS)
    assert code == 0 and i["rollback_window"]["earliest"] <= n, i["rollback_window"]
    code, r = rollback(run, n, "--yes")
    assert code == 0, r
    assert finish_and_read(spark, run) == exact(run)


@pytest.mark.parametrize("flavour", ["hdfs"])
def test_a_wrong_sidecar_of_a_sink_data_file_fails_spark_readers_and_is_an_error(spark, run):
    part = sorted(name for name in os.listdir(run.output) if name.startswith("part-"))[0]
    sidecar = os.path.join(run.output, f".{part}.crc")
    data = bytearray(open(sidecar, "rb").read())
    data[-1] ^= 0xFF
    open(sidecar, "wb").write(bytes(data))
    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, "--deep", *INTERVALS)
    assert code == 1, f
    found = [(x["severity"], x["code"], x["path"]) for x in f["findings"]]
    assert found == [("error", "stale-crc", sidecar)], f
    with pytest.raises(Exception, match="(?i)checksum|footer"):
        spark.read.parquet(run.output).collect()


@pytest.mark.parametrize("flavour", ["hdfs", "rocksdb"])
def test_wrong_sidecars_of_state_files_fail_rocksdbs_load_not_the_hdfs_stores(spark, run):
    """RocksDB reads its files through Hadoop's FileSystem API, which checks the sidecars: errors, damage in the
    restart set, and Spark's restart fails. The HDFS store does not check them (a second review: they were called
    errors and the rollback refused, though Spark restarts exactly): warnings, and the rollback goes through."""
    flipped = _flip_sidecars(run.checkpoint, state_files=True)
    n = target_before_last_compaction(run)
    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, "--deep", *INTERVALS)
    assert code == 1, f
    if run.flavour == "hdfs":
        assert any(rel.endswith(".delta") for rel in flipped), flipped
        assert {(x["severity"], x["code"]) for x in f["findings"]} == {("warning", "stale-crc")}, f
        code, r = rollback(run, n, "--yes")
        assert code == 0, r
        assert finish_and_read(spark, run) == exact(run)
        return
    assert any(rel.endswith(".zip") for rel in flipped), flipped
    assert {x["code"] for x in f["findings"] if x["severity"] == "error"} >= {"stale-crc", "state-file-damaged"}, f
    assert all(x["severity"] == "error" for x in f["findings"] if x["code"] == "stale-crc"), f
    code, r = rollback(run, n, "--yes")
    assert code == 2 and "checksum" in r["problem"], r
    with pytest.raises(Exception, match="CANNOT_LOAD_STATE_STORE|Checksum"):
        finish_and_read(spark, run)
