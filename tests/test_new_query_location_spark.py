"""Where Spark starts a new query, and where it refuses to: our verdict against Spark's, case by case.

A location with no file Spark reads is "no checkpoint yet" to compat (the Dagster step's check before a run),
to the health check (``query_owner.not_started``) and to fsck and inspect. Spark 4.1+ starts a new query there
only while ``offsets/``, ``commits/`` and ``state/`` hold nothing, a temp file or an empty directory included
(STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY); a temp file in the root, an empty ``offsets/`` or ``sources/0``
does not stop it, and an orphan ``offsets/.0.crc`` fails its first write. Each case below is built by hand (bad input), judged by us, then started by Spark.
"""

from __future__ import annotations

import os
import shutil
import uuid

import pytest

from checkpoint_ops.compat import check_compat
from checkpoint_ops.errors import BadInputError
from checkpoint_ops.model import Checkpoint
from checkpoint_ops.query_owner import not_started
from checkpoint_ops.storage import open_file_manager
from pipelines.event_counts import counts_writer, expected_windows, flush_files, read_output, write_event_files
from tests.helpers import cli_json, tree_snapshot
from tests.spark_runs import FLAVOURS, SESSION_CONF, SparkRun, unload_state_stores

TEMP = f".0.{uuid.uuid4()}.tmp"

METADATA = "metadata"
COMMIT = "commits/0"
NOT_EMPTY = "STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY"
ORPHAN_CRC = "concurrently using"  # Spark's first write of offsets/0 fails on the .crc already there
# case -> (files, empty directories) under the checkpoint location, and what Spark's first run there says (None:
# it starts the query)
CASES = {
    "metadata and a temp file in offsets/": ([METADATA, f"offsets/{TEMP}"], [], NOT_EMPTY),
    "metadata and a temp file's .crc in offsets/": ([METADATA, f"offsets/.{TEMP}.crc"], [], None),
    "metadata and an orphan offsets/.0.crc": ([METADATA, "offsets/.0.crc"], [], ORPHAN_CRC),
    "metadata and commits/0, no offsets": ([METADATA, COMMIT], [], "assertion failed"),
    "temp files only in state/0/0": ([f"state/0/0/{TEMP}", f"state/0/0/.{TEMP}.crc"], [], NOT_EMPTY),
    "temp file in the root": ([f".metadata.{uuid.uuid4()}.tmp"], [], None),
    "empty offsets/ and commits/": ([], ["offsets", "commits"], None),
    "empty state/": ([], ["state"], None),
    "empty sources/0": ([], ["sources/0"], None),
    "temp file in offsets/": ([f"offsets/{TEMP}"], [], NOT_EMPTY),
    "temp file in commits/": ([f"commits/{TEMP}"], [], NOT_EMPTY),
    "temp file in a state store": ([f"state/0/0/{TEMP}"], [], NOT_EMPTY),
    "a temp file and an empty directory": ([f"offsets/{TEMP}"], ["state/0/1"], NOT_EMPTY),
    "empty state/0": ([], ["state/0"], NOT_EMPTY),
    "empty state/0/1": ([], ["state/0/1"], NOT_EMPTY),
    "empty offsets/0": ([], ["offsets/0"], NOT_EMPTY),
}
CONTENT = {METADATA: b'{"id":"6f0c1c9e-7c1b-4a5e-9d38-1c0d2b3e4f50"}', COMMIT: b'v1\n{"nextBatchWatermarkMs":0}'}


def _ours(spark, ckpt: str, inp: str, out: str) -> tuple[bool, str]:
    """(whether compat judges a new query startable here, what it said), after checking that the health check
    agrees: ``not_started`` where no file Spark reads is there, else fsck's errors."""
    fm, root = open_file_manager(ckpt)
    owner = not_started(fm, root, "q", [])
    code, shown = cli_json("fsck", ckpt)
    if owner is not None:  # nothing Spark reads is there: fsck has nothing to judge, and says why if Spark refuses
        healthy, health_said = owner.problem is None, str(owner)
        assert code == 2 and (NOT_EMPTY in shown["problem"]) == (not healthy), shown
    else:
        errors = [f for f in shown["findings"] if f["severity"] == "error"]
        healthy, health_said = not errors, str(errors)
        assert code == (1 if shown["findings"] else 0), shown
        assert all(f["code"] in ("new-query-refused", "orphan-crc", "offsets-gap") for f in errors), shown
    try:
        report = check_compat(Checkpoint(fm, root), spark, lambda s: counts_writer(s, inp, out).option(
            "checkpointLocation", ckpt).trigger(availableNow=True))
    except BadInputError as e:
        assert not healthy, f"compat refused, the health check did not: {e.render()}; {health_said}"
        return False, e.render()
    assert healthy, f"compat passed, the health check did not: {health_said}"
    return True, report.render()


@pytest.mark.parametrize("case", sorted(CASES))
def test_spark_and_we_agree_where_a_new_query_starts(spark, tmp_path, case):
    files, dirs, spark_says = CASES[case]
    for key, value in {**SESSION_CONF, **FLAVOURS["hdfs"]}.items():
        if key.startswith("spark.sql."):
            spark.conf.set(key, value)
    inp, out, ckpt = (str(tmp_path / name) for name in ("input", "output", "checkpoint"))
    write_event_files(inp, 0, 2)
    os.makedirs(ckpt)
    for rel in dirs:
        os.makedirs(os.path.join(ckpt, rel))
    for rel in files:
        os.makedirs(os.path.dirname(os.path.join(ckpt, rel)), exist_ok=True)
        with open(os.path.join(ckpt, rel), "wb") as f:
            f.write(CONTENT.get(rel, b'{"id":"'))  # a temp file: cut off mid-write
    before = tree_snapshot(ckpt)
    we_start, said = _ours(spark, ckpt, inp, out)
    assert tree_snapshot(ckpt) == before, "judging it changed it"
    if spark_says == ORPHAN_CRC:
        assert "delete the sidecars" in said and ORPHAN_CRC in said, said
    if COMMIT in files:
        assert "lost its offsets log" in said and "restore the checkpoint from a backup" in said, said
    elif not we_start and spark_says == NOT_EMPTY:  # every blocker named in one fix
        assert NOT_EMPTY in said, said
        in_subdirectory = any(rel.count("/") > 1 and ".tmp" in rel for rel in files)  # left empty once deleted
        assert ("remove the directories" in said) == bool(dirs or in_subdirectory), said
        assert ("delete the temp files" in said) == any(".tmp" in rel for rel in files), said

    query = counts_writer(spark, inp, out).option("checkpointLocation", ckpt).trigger(availableNow=True).start()
    try:
        query.awaitTermination()
        started = True
    except Exception as e:  # noqa: BLE001 - Spark's refusal, checked below
        assert spark_says is not None and spark_says in str(e), e
        started = False
    finally:
        unload_state_stores(spark)
    assert started == (spark_says is None), f"Spark {'started' if started else 'refused'}: the case's expectation is wrong"
    assert we_start == started, f"we said {'start' if we_start else 'refuse'}, Spark did otherwise: {said}"
    if started:
        assert sorted(n for n in os.listdir(os.path.join(ckpt, "commits")) if n.isdigit()), "Spark ran no batch"


def test_directory_markers_on_an_object_store_are_judged_as_spark_lists_them(s3_server, bucket):
    """On S3 a directory may be a marker object (``offsets/``). S3A leaves a directory's own marker out of its
    listing, so Spark starts a new query where ``offsets/`` and ``commits/`` are markers (Spark creates both at a
    query's start); a marker of a subdirectory (``state/0/``) is a directory Spark lists, and it refuses."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_server)

    def judged(prefix: str, keys: dict[str, bytes]):
        for key, body in keys.items():
            s3.put_object(Bucket=bucket, Key=f"{prefix}/{key}", Body=body)
        url = f"s3://{bucket}/{prefix}"
        fm, root = open_file_manager(url)
        return url, not_started(fm, root, "q", [])

    markers = {"offsets/": b"", "commits/": b""}
    url, owner = judged("started", {"metadata": CONTENT[METADATA], **markers})
    assert owner is None  # metadata is there: fsck judges it
    code, shown = cli_json("fsck", url)
    assert code == 0 and shown["findings"] == [], shown

    # a Hadoop sidecar copied to S3 with a local checkpoint: S3A never writes one, so no write of Spark's fails on it
    url, owner = judged("copied-sidecar", {"metadata": CONTENT[METADATA], "offsets/0": b'v1\n{}\n{"logOffset":0}',
                                           "commits/0": CONTENT[COMMIT], "offsets/.6.crc": b"crc"})
    code, shown = cli_json("fsck", url)
    assert [(f["severity"], f["code"]) for f in shown["findings"]] == [("warning", "orphan-crc")], shown

    # markers and nothing else: as empty directories on local disk, no checkpoint (fsck exited 1 here, inspect 0)
    url, owner = judged("markers-only", markers)
    for command in ("fsck", "inspect"):
        code, shown = cli_json(command, url)
        assert code == 2 and "nothing found at this location" in shown["problem"], shown

    # an empty state/0 beside them: named as on local disk (no file at all: exit 2 naming what stops Spark)
    url, owner = judged("state-marker", {**markers, "state/0/": b""})
    code, refused = cli_json("fsck", url)
    assert code == 2 and NOT_EMPTY in refused["problem"], refused
    assert "state/0" in refused["problem"] and refused["fix"].startswith("remove the directories"), refused
    # and with metadata there, the finding
    url, owner = judged("state-marker-started", {"metadata": CONTENT[METADATA], **markers, "state/0/": b""})
    code, shown = cli_json("fsck", url)
    (refused,) = [f for f in shown["findings"] if f["severity"] == "error"]
    assert code == 1 and refused["code"] == "new-query-refused" and NOT_EMPTY in refused["problem"], shown
    assert "state/0" in refused["problem"] and "remove the directories" in refused["fix"], refused


NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"


@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_a_torn_offsets_0_of_a_batch_that_never_committed_is_repaired_by_following_fsck(spark, tmp_path, flavour):
    """Batch 0 wrote its state and the sink's log, the query died before ``commits/0``, and ``offsets/0`` is torn
    (zero bytes). fsck's fix for the torn file (delete it with its sidecar) left state that Spark refuses to start
    a new query over, and fsck then said "a checkpoint that lost its offsets log? restore it from a backup" (and
    its state-stale fix read ``--to-batch None``). Deleting state/ alone is not enough either: Spark skips batch 0,
    which the file sink's log holds, so batch 0's state is never written again and batch 1 fails
    (CANNOT_READ_DELTA_FILE_NOT_EXISTS). The fixes now name every step: followed one by one, Spark runs the
    query afresh and writes every window exactly once."""
    run = SparkRun(flavour, str(tmp_path / "q"))
    os.makedirs(run.base)
    write_event_files(run.input, 0, 1)
    try:
        run.run_query(spark, conf={NO_DATA_BATCHES: "false"})  # batch 0 only: no batch that moves the watermark
    finally:
        spark.conf.set(NO_DATA_BATCHES, "true")
    ckpt = run.checkpoint
    assert sorted(n for n in os.listdir(os.path.join(ckpt, "commits")) if n.isdigit()) == ["0"]
    for rel in ("commits/0", "commits/.0.crc"):  # the query died before its commit
        os.remove(os.path.join(ckpt, rel))
    open(os.path.join(ckpt, "offsets", "0"), "wb").close()  # and offsets/0 is torn

    code, r = cli_json("fsck", ckpt)
    torn = next(f for f in r["findings"] if f["path"].endswith("offsets/0"))
    assert code == 1 and "deleted with its `.N.crc` sidecar" in torn["fix"] and "offsets/0" in torn["fix"], r
    assert "state/ too" in torn["fix"], torn
    for rel in ("offsets/0", "offsets/.0.crc"):
        os.remove(os.path.join(ckpt, rel))

    code, r = cli_json("fsck", ckpt)
    assert code == 1, r
    refused = next(f for f in r["findings"] if f["code"] == "new-query-refused")
    assert "batch 0 never committed" in refused["problem"] and "delete state/" in refused["fix"], refused
    assert "_spark_metadata/0" in refused["fix"] and "sink files OUTPUT --batch 0" in refused["fix"], refused
    assert not any("None" in f["fix"] for f in r["findings"]), r
    shutil.rmtree(os.path.join(ckpt, "state"))
    code, listed = cli_json("sink", "files", run.output, "--batch", "0")
    assert code == 0 and listed["files"], listed
    for f in listed["files"]:
        os.remove(f["path"].removeprefix("file://"))
    for rel in ("_spark_metadata/0", "_spark_metadata/.0.crc"):
        os.remove(os.path.join(run.output, rel))

    code, r = cli_json("fsck", ckpt)
    assert not [f for f in r.get("findings", []) if f["severity"] == "error"], r
    write_event_files(run.input, 1, 3)
    flush_files(run.input, 2)
    run.run_query(spark)
    expected = {key: [value] for key, value in expected_windows(range(3)).items()}
    assert read_output(spark, run.output) == expected
