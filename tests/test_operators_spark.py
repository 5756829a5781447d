"""Every stateful operator PySpark 4.3 offers, on the state stores Spark allows for it, judged by Spark.

Spark writes each checkpoint (tests/operator_runs.py: stream-stream inner and left outer joins,
dropDuplicates, dropDuplicatesWithinWatermark, a session window, applyInPandasWithState with a
timeout, transformWithStateInPandas with value, list and map state and timers, and a query with two
stateful operators chained); we roll it back, undo, back it up and restore it, and Spark resumes with
exactly the output of the run that was never interrupted (no missing and no duplicate row).

The default run covers a representative part of the operator x state store matrix: every operator at
least once, every state store at least once, checkpoint format V2 for the most complex ones (outer
join, transformWithState, the chained operators). ``make test-operators`` runs all of it.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.helpers import cli, cli_json, content_snapshot, tree_snapshot
from tests.operator_runs import COMPACT_INTERVAL, QUERIES
from tests.test_bad_input_corpus import remove_with_sidecars

INTERVALS = ("--source-compact-interval", str(COMPACT_INTERVAL), "--sink-compact-interval", str(COMPACT_INTERVAL))

DEFAULT_CELLS = [
    ("join_inner", "hdfs"),
    ("join_left_outer", "rocksdb_v2"),
    ("drop_duplicates", "rocksdb"),
    ("drop_duplicates_within_watermark", "hdfs"),
    ("session_window", "rocksdb"),
    ("apply_in_pandas_with_state", "hdfs"),
    ("transform_with_state_in_pandas", "rocksdb_v2"),
    ("dedup_then_window", "rocksdb_v2"),
]
FULL_CELLS = [(q.name, f) for q in QUERIES.values() for f in q.flavours if (q.name, f) not in DEFAULT_CELLS]
CELLS = ([pytest.param(c, id=f"{c[0]}-{c[1]}", marks=pytest.mark.operators) for c in DEFAULT_CELLS]
         + [pytest.param(c, id=f"{c[0]}-{c[1]}", marks=[pytest.mark.operators, pytest.mark.operators_full])
            for c in FULL_CELLS])


def _fresh(request, operator_runs):
    run = operator_runs(*request.param)
    run.reset()
    yield run
    run.reset()


@pytest.fixture(params=CELLS)
def op_run(request, operator_runs):
    """A freshly reset generated checkpoint of one operator query on one state store."""
    yield from _fresh(request, operator_runs)


@pytest.fixture(params=[p for p in CELLS if p.values[0][0].startswith("join")])
def join_run(request, operator_runs):
    """The same, for the stream-stream joins only."""
    yield from _fresh(request, operator_runs)


@pytest.fixture(params=[p for p in CELLS if p.values[0][0].startswith("transform")])
def tws_run(request, operator_runs):
    """The same, for transformWithStateInPandas only."""
    yield from _fresh(request, operator_runs)


def target_across_compaction(run) -> int:
    """A batch before the newest compaction of the sink and source logs and before the second query run
    (whose first batch wrote transformWithState's operator metadata again), inside the rollback window."""
    target = min((run.last_batch + 1) // COMPACT_INTERVAL * COMPACT_INTERVAL - 1 - 2, run.restart_batch - 1)
    code, i = cli_json("inspect", run.checkpoint, "--sink", run.output, *INTERVALS)
    assert code == 0, i
    w = i["rollback_window"]
    assert w["earliest"] <= target <= w["latest"] == run.last_batch, (target, w)
    return target


def rollback(run, n, *extra):
    return cli_json("rollback", run.checkpoint, "--to-batch", n, "--sink", run.output, *INTERVALS, *extra)


def test_rollback_undo_and_resume_exactly(spark, op_run):
    """Rollback to N leaves a checkpoint fsck finds clean; undo puts back every byte; rolled back
    again, Spark resumes with exactly the uninterrupted run's output."""
    run = op_run
    n = target_across_compaction(run)
    before = content_snapshot(run.checkpoint, run.output)
    code, r = rollback(run, n, "--yes")
    assert code == 0, r
    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS, "--deep")
    assert (code, f["findings"]) == (0, [])
    code, i = cli_json("inspect", run.checkpoint, *INTERVALS)
    assert i["last_committed_batch"] == n
    assert {op["versions"]["last"] for op in i["state"]["operators"]} == {n + 1}
    code, u = cli_json("undo", run.checkpoint, "--yes")
    assert code == 0, u
    assert content_snapshot(run.checkpoint, run.output) == before
    code, r = rollback(run, n, "--yes")
    assert code == 0, r
    assert run.resume_and_read(spark) == run.reference


def test_restore_to_batch_resumes_exactly(spark, op_run, tmp_path):
    """A backup restored elsewhere at an earlier batch resumes exactly, with the original location
    gone while it runs (nothing in the restored checkpoint may point back at it)."""
    run = op_run
    n = target_across_compaction(run)
    dest = str(tmp_path / "backups")
    code, b = cli_json("backup", "create", run.checkpoint, dest, "--sink", run.output, *INTERVALS)
    assert code == 0, b
    inp, out, ckpt = str(tmp_path / "input"), str(tmp_path / "output"), str(tmp_path / "checkpoint")
    shutil.copytree(run.input, inp)
    code, r = cli_json("backup", "restore", dest, b["backup_id"], ckpt, "--sink-target", out,
                       "--relocate", f"{run.input}={inp}", "--to-batch", n, "--yes")
    assert code == 0, r
    code, f = cli_json("fsck", ckpt, "--sink", out, *INTERVALS, "--deep")
    assert (code, f["findings"]) == (0, [])
    away = run.base + ".away"
    os.rename(run.base, away)
    try:
        got = run.resume_and_read(spark, checkpoint=ckpt, output=out, inputs=inp)
    finally:
        os.rename(away, run.base)
    assert got == run.reference


# ---- inspect: every operator, judged by Spark's own state readers ------------------------------------------


def test_inspect_shows_each_operator_as_spark_reads_it(spark, op_run):
    """Names, stores and partitions agree with Spark's state-metadata source; each store's key and value
    schema with Spark's statestore reader (per state variable for transformWithState)."""
    run, query = op_run, op_run.query
    code, r = cli_json("inspect", run.checkpoint, *INTERVALS)
    assert code == 0 and r["damaged"] == []
    ops = r["state"]["operators"]
    assert [op["name"] for op in ops] == list(query.operators)
    assert ops[0]["stores"] == list(query.stores)
    meta = spark.read.format("state-metadata").load(run.checkpoint).collect()
    assert {(m.operatorId, m.operatorName, m.stateStoreName, m.numPartitions) for m in meta} == {
        (op["id"], op["name"], s["name"], s["partitions"]) for op in ops for s in op["state_stores"]}
    for op in ops:
        assert op["metadata"]["format_version"] == (2 if query.name.startswith("transform") else 1)
        for store in op["state_stores"]:
            assert store["files"] > 0 and store["bytes"] > 0
            assert store["versions"]["last"] == run.last_batch + 1
            schema_file = store["schema_files"][-1]
            assert schema_file["batches"]["last"] == run.last_batch and schema_file["format_version"]
            if query.name.startswith("transform"):
                families = {cf["name"]: cf for cf in store["column_families"]}
                df = spark.read.format("statestore").option("operatorId", op["id"]).option("stateVarName", "count") \
                    .load(run.checkpoint)
                assert families["count"]["key_schema"] == df.schema["key"].dataType.simpleString()
                assert families["count"]["value_schema"] == df.schema["value"].dataType.simpleString()
                assert {"count", "values", "parities"} <= set(families)
                # the second query run wrote operator metadata again; the schema did not change, so it
                # names the first run's schema file, which covers every batch
                assert op["metadata"]["batch"] > 0 and op["metadata"]["properties"]["timeMode"] == "EventTime"
                assert [f["batches"] for f in store["schema_files"]] == [{"first": 0, "last": run.last_batch}]
            else:
                df = spark.read.format("statestore").option("operatorId", op["id"]) \
                    .option("storeName", store["name"]).load(run.checkpoint)
                assert store["key_schema"] == df.schema["key"].dataType.simpleString()
                assert store["value_schema"] == df.schema["value"].dataType.simpleString()
    code, out, _ = cli("inspect", run.checkpoint, *INTERVALS)
    for op in ops:
        for store in op["state_stores"]:
            assert f"store {store['name']}: {store['partitions']} partitions" in out
            assert store["schema_files"][-1]["path"] in out


# ---- fsck: healthy, and damage in the operators' own files ----------------------------------------------------


def restart_schema_file(run) -> str:
    """The state schema file Spark reads first when the query restarts: the v3 file the newest operator
    metadata v2 names (transformWithState), else partition 0's v1/v2 file of the first store."""
    v2 = os.path.join(run.checkpoint, "state/0/_metadata/v2")
    if os.path.isdir(v2):
        newest = max((n for n in os.listdir(v2) if n.isdigit()), key=int)
        doc = json.loads(open(os.path.join(v2, newest)).read().split("\n", 1)[1])
        path = doc["stateStoreInfo"][0]["stateSchemaFilePaths"][0]
        return path.removeprefix("file:")
    store = run.query.stores[0]
    return os.path.join(run.checkpoint, "state/0/0", "" if store == "default" else store, "_metadata/schema")


def newest_operator_metadata(run) -> str:
    v2 = os.path.join(run.checkpoint, "state/0/_metadata/v2")
    if os.path.isdir(v2):
        return os.path.join(v2, max((n for n in os.listdir(v2) if n.isdigit()), key=int))
    return os.path.join(run.checkpoint, "state/0/_metadata/metadata")


def damage(path: str, how: str) -> None:
    """Damage a file the way a torn or foreign write would (its Hadoop checksum sidecar goes too)."""
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2] if how == "truncate" else b"\x00garbage, not written by Spark")
    crc = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.crc")
    if os.path.exists(crc):
        os.remove(crc)


def findings_by_path(f: dict) -> dict[str, dict]:
    return {x["path"]: x for x in f["findings"]}


def test_fsck_is_clean_on_the_healthy_checkpoint(op_run):
    run = op_run
    before = tree_snapshot(run.checkpoint, run.output)
    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS, "--deep")
    assert (code, f["findings"]) == (0, [])
    assert tree_snapshot(run.checkpoint, run.output) == before


def test_a_damaged_state_schema_file_is_named_and_refused(op_run):
    """Spark reads it to restart (it fails: see test_spark_refuses_what_fsck_calls_damaged), so fsck
    calls it an error and a rollback that needs it changes nothing (exit 2)."""
    run = op_run
    n = target_across_compaction(run)
    path = restart_schema_file(run)
    damage(path, "truncate")
    before = tree_snapshot(run.checkpoint, run.output)
    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    finding = findings_by_path(f).get(path)
    assert code == 1 and finding is not None, f
    assert (finding["severity"], finding["code"]) == ("error", "state-schema-damaged")
    assert "truncated" in finding["problem"]
    code, r = rollback(run, n, "--dry-run")
    assert code == 2 and r["path"] == path, r
    code, i = cli_json("inspect", run.checkpoint, *INTERVALS)
    assert code == 0 and path in {d["path"] for d in i["damaged"]}
    assert tree_snapshot(run.checkpoint, run.output) == before


def test_damaged_operator_metadata_is_named(op_run):
    """transformWithState's operator metadata v2 is read to restart: an error; a rollback that needs it is
    refused, one to before the query run that wrote it removes it. Other operators' v1 metadata is not
    read (Spark 4.3 ignores it: see test_spark_ignores_damaged_v1_operator_metadata): a warning, and
    rollbacks proceed."""
    run = op_run
    path = newest_operator_metadata(run)
    damage(path, "garbage")
    before = tree_snapshot(run.checkpoint, run.output)
    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    finding = findings_by_path(f).get(path)
    assert code == 1 and finding is not None, f
    assert finding["code"] == "operator-metadata-damaged"
    code, r = rollback(run, run.last_batch - 1, "--dry-run")
    if "/_metadata/v2/" in path:
        assert finding["severity"] == "error"
        assert code == 2 and r["path"] == path, r
        assert int(os.path.basename(path)) == run.restart_batch
        code, r = rollback(run, run.restart_batch - 1, "--dry-run")
        assert code == 0, r
        assert os.path.relpath(path, run.checkpoint) in {a["rel"] for a in r["plan"]["actions"] if a["kind"] == "delete"}
    else:
        assert finding["severity"] == "warning"
        assert code == 0, r
    assert tree_snapshot(run.checkpoint, run.output) == before


def test_a_missing_file_of_each_join_store_is_named(join_run):
    """A stream-stream join keeps four stores per partition: losing the newest state file of each is
    named store by store, and only a rollback past it goes ahead."""
    run = join_run
    c = run.last_batch
    removed = set()
    for store in run.query.stores:
        d = os.path.join(run.checkpoint, "state/0/0", store)
        for name in os.listdir(d):
            if not name.startswith(".") and name.split(".")[0].split("_")[0] == str(c + 1):
                remove_with_sidecars(os.path.join(d, name))
                removed.add(store)
    assert removed == set(run.query.stores)
    before = tree_snapshot(run.checkpoint, run.output)
    code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    assert code == 1
    for store in run.query.stores:
        named = [x for x in f["findings"] if f"/state/0/0/{store}/" in x["path"]]
        assert [(x["severity"], x["code"]) for x in named] == [("error", "state-missing")], (store, f["findings"])
        assert f"version {c + 1}" in named[0]["problem"]
    code, r = rollback(run, c, "--dry-run")
    assert code == 2 and "/state/0/0/" in r["path"], r
    code, r = rollback(run, c - 1, "--dry-run")  # version c+1 goes with the rollback anyway
    assert code == 0, r
    assert tree_snapshot(run.checkpoint, run.output) == before


def test_a_deleted_state_directory_of_each_operator_is_named(spark, op_run):
    """Spark writes every partition of every store at every version, so a directory deleted whole (a
    partition, one store of a join partition, an operator below the last) fails every restart, and leaves no
    file to judge: fsck names it from the operator metadata and the operator ids, and every rollback is
    refused, with nothing changed. Spark then fails to restart as fsck says it will: CANNOT_LOAD_STATE_STORE, or
    for a whole operator STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA (its operator metadata is gone)."""
    run = op_run
    part = os.path.join(run.checkpoint, "state", "0", "1")
    stores = sorted(d for d in os.listdir(part) if os.path.isdir(os.path.join(part, d))
                    and d not in ("_metadata", "SSTs", "logs"))
    cases = [f"state/0/1/{stores[-1]}" if stores else "state/0/1"]
    if os.path.isdir(os.path.join(run.checkpoint, "state", "1")):  # two operators: the first one whole
        cases.append("state/0")
    for gone in cases:
        run.reset()
        shutil.rmtree(os.path.join(run.checkpoint, gone))
        before = tree_snapshot(run.checkpoint, run.output)
        code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
        named = [x for x in f["findings"] if x["code"] == "state-missing" and x["path"].endswith(gone)]
        assert code == 1 and len(named) == 1, (gone, f["findings"])
        # a whole operator takes its operator metadata along, which Spark checks the query against first
        said = "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA" if gone == "state/0" else "CANNOT_LOAD_STATE_STORE"
        assert said in named[0]["problem"], named[0]
        code, r = rollback(run, run.last_batch - 1, "--dry-run")
        assert code == 2 and r["path"].endswith(gone), r
        assert tree_snapshot(run.checkpoint, run.output) == before
        run.write_flush_files()
        with pytest.raises(Exception) as failed:  # what fsck said
            run.run_query(spark)
        assert said in str(failed.value), (gone, str(failed.value)[:3000])


def test_a_copied_transform_with_state_checkpoint_is_flagged(tws_run, tmp_path):
    """Operator metadata v2 names its schema files by absolute path, and Spark reads them there: a copy
    works only while the original exists (a restore rewrites the paths, see the restore test)."""
    run = tws_run
    copy = str(tmp_path / "copy")
    shutil.copytree(run.checkpoint, copy)
    code, f = cli_json("fsck", copy, *INTERVALS)
    assert code == 1
    assert [(x["severity"], x["code"]) for x in f["findings"]] == [("warning", "state-schema-outside-checkpoint")]
    assert f["findings"][0]["path"] == newest_operator_metadata(run).replace(run.checkpoint, copy)


def test_the_schema_parser_reads_every_schema_file_spark_wrote(op_run):
    """Every schema file parses; every shorter prefix of it is reported torn, a newer version as such,
    garbage as unreadable: never a crash, never a wrong schema."""
    from checkpoint_ops.model.state_schema import StateSchemaError, parse_state_schema

    files = [os.path.join(d, n) for d, _, names in os.walk(os.path.join(op_run.checkpoint, "state"))
             for n in names if not n.startswith(".") and (n == "schema" or "_stateSchema" in d)]
    assert files
    for path in files:
        data = open(path, "rb").read()
        parsed = parse_state_schema(data, path, path)
        assert parsed.column_families and all(cf.key_schema["type"] == "struct" for cf in parsed.column_families)
        for cut in range(len(data)):
            with pytest.raises(StateSchemaError) as e:
                parse_state_schema(data[:cut], path, path)
            assert e.value.kind in ("empty", "truncated"), (cut, e.value.problem)
        with pytest.raises(StateSchemaError) as e:
            parse_state_schema(b"\x00\x03v99" + data[4:], path, path)
        assert e.value.kind == "unknown-version"
        with pytest.raises(StateSchemaError) as e:
            parse_state_schema(data[:4] + b"\xff" * 40, path, path)
        assert e.value.kind == "malformed"


# ---- Spark is the judge of what fsck calls damage -------------------------------------------------------------


@pytest.mark.operators
@pytest.mark.parametrize("cell,what", [
    (("drop_duplicates", "rocksdb"), "schema"),
    (("transform_with_state_in_pandas", "rocksdb_v2"), "schema"),
    (("transform_with_state_in_pandas", "rocksdb_v2"), "metadata"),
], ids=["v2-schema", "v3-schema", "v2-operator-metadata"])
def test_spark_refuses_what_fsck_calls_damaged(spark, operator_runs, cell, what):
    run = operator_runs(*cell)
    run.reset()
    try:
        path = restart_schema_file(run) if what == "schema" else newest_operator_metadata(run)
        damage(path, "truncate" if what == "schema" else "garbage")
        code, f = cli_json("fsck", run.checkpoint, *INTERVALS)
        assert code == 1 and findings_by_path(f)[path]["severity"] == "error"
        run.write_flush_files()
        with pytest.raises(Exception):
            run.run_query(spark)
        assert max(int(n) for n in os.listdir(os.path.join(run.checkpoint, "commits")) if n.isdigit()) == run.last_batch
    finally:
        run.reset()


@pytest.mark.operators
def test_spark_ignores_damaged_v1_operator_metadata(spark, operator_runs):
    """Why fsck only warns about it: a rollback goes ahead, and Spark resumes exactly."""
    run = operator_runs("drop_duplicates", "rocksdb")
    run.reset()
    try:
        n = target_across_compaction(run)
        damage(newest_operator_metadata(run), "garbage")
        code, r = rollback(run, n, "--yes")
        assert code == 0, r
        assert run.resume_and_read(spark) == run.reference
    finally:
        run.reset()


def test_spark_judges_the_unchanged_query_restartable(spark, op_run):
    """compat's judge restarts each operator's query on a scratch copy of what Spark reads to restart
    (restart_judge.py): every store's files must be in it (a RocksDB zip's SSTs, format V2's checksum
    files, operator metadata and state schemas), or Spark refuses an unchanged query."""
    from checkpoint_ops.compat import FAILS, check_compat
    from checkpoint_ops.model import Checkpoint
    from tests.operator_runs import OPERATOR_CONF
    from tests.spark_runs import FLAVOURS, SESSION_CONF

    for key, value in {**SESSION_CONF, **OPERATOR_CONF, **FLAVOURS[op_run.flavour]}.items():
        if key.startswith("spark.sql."):
            spark.conf.set(key, value)

    def build(session):
        df = op_run.query.build(session, {s: op_run.input_dir(s) for s in op_run.query.sources})
        return (df.writeStream.format("parquet").outputMode("append").option("path", op_run.output)
                .option("checkpointLocation", op_run.checkpoint).trigger(availableNow=True))

    before = tree_snapshot(op_run.base)
    report = check_compat(Checkpoint.open(op_run.checkpoint), spark, build)
    assert tree_snapshot(op_run.base) == before, "compat changed something"
    assert report.spark_restarts is True and report.of(FAILS) == [], report.render()
