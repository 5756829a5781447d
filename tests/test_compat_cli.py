"""``checkpoint-ops compat`` as a user runs it: a query module in the current directory, ``--query
MODULE:FUNCTION``, exit 0 / 1 / 2, the documented JSON keys, ``--record``; and unusable input (exit 2, the
file named, nothing changed)."""

from __future__ import annotations

import json
import os
import uuid

import pytest

from checkpoint_ops.fence import Fence, fence_bytes
from checkpoint_ops.query_profile import profile_path, read_profile
from checkpoint_ops.storage import open_file_manager
from tests.compat_queries import use_session_conf
from tests.helpers import cli, cli_json, tree_snapshot

QUERY_MODULE = '''
from pipelines.event_counts import counts_writer, read_events, windowed_counts
from pyspark.sql import functions as F

BASE = {base!r}

def unchanged(spark):
    return counts_writer(spark, BASE + "/input", BASE + "/output")

def key_changed(spark):
    events = read_events(spark, BASE + "/input").withColumn("key", F.length("key"))
    return windowed_counts(events).writeStream.format("parquet").option("path", BASE + "/output")

def more_partitions(spark):
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    return counts_writer(spark, BASE + "/input", BASE + "/output")

def fails(spark):
    raise RuntimeError("the query code has a bug")

def not_a_writer(spark):
    return read_events(spark, BASE + "/input")
'''

DIFFERENCE_KEYS = {"aspect", "verdict", "was", "now", "effect", "rule", "error_class", "found_by", "fix",
                   "rollback_to"}
REPORT_KEYS = {"checkpoint", "batch", "compatible", "spark_restarts", "differences", "notes", "judge", "query",
               "recorded_profile"}


@pytest.fixture
def agg(spark, compat_bases, tmp_path, monkeypatch):
    """The agg base, reset, and a fresh query module for it in the current directory: (base, module name)."""
    base = compat_bases("agg")
    base.reset()
    use_session_conf(spark)
    name = f"streams_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(QUERY_MODULE.format(base=base.root))
    monkeypatch.chdir(tmp_path)
    yield base, name
    use_session_conf(spark)
    base.reset()


def test_exit_codes_and_json(agg):
    base, module = agg
    before = tree_snapshot(base.root)

    code, doc = cli_json("compat", base.checkpoint, "--query", f"{module}:unchanged")
    assert code == 0 and set(doc) == REPORT_KEYS
    assert doc["compatible"] is True and doc["spark_restarts"] is True and doc["differences"] == []
    assert doc["batch"] == 3 and doc["judge"]["restarted"] and doc["judge"]["batch"] == 4
    assert doc["judge"]["operators"] == ["stateStoreSave"]
    assert doc["query"]["sink"] == {"kind": "file", "format": "parquet", "path": base.output, "partition_by": []}
    assert doc["query"]["operators"][0]["windows"] == ["window(ts, '30 seconds')"]
    assert doc["recorded_profile"]["judged"] is False  # the base recorded its query before its first run

    code, doc = cli_json("compat", base.checkpoint, "--query", f"{module}:key_changed")
    assert code == 1 and doc["compatible"] is False and doc["spark_restarts"] is False
    (diff,) = doc["differences"]
    assert set(diff) == DIFFERENCE_KEYS
    assert diff["verdict"] == "fails-at-restart" and diff["found_by"] == "spark"
    assert diff["error_class"] == "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE" and diff["aspect"] == "state-schema"
    assert "StringType" in diff["was"] and "IntegerType" in diff["now"]

    code, out, err = cli("compat", base.checkpoint, "--query", f"{module}:more_partitions")
    assert code == 1 and err == ""
    assert "SILENTLY DIFFERENT  conf" in out and "spark.sql.shuffle.partitions=2" in out
    assert "the state stays in 2 partitions" in out
    assert tree_snapshot(base.root) == before, "compat changed files"


def test_record_writes_only_the_profile_beside_the_checkpoint(agg):
    base, module = agg
    fm, root = open_file_manager(base.checkpoint)
    spark_files = tree_snapshot(base.checkpoint, base.output)
    code, out, _ = cli("compat", base.checkpoint, "--query", f"{module}:unchanged", "--record")
    assert code == 0 and "recorded the query's profile" in out
    record = read_profile(fm, root)
    assert record.judged  # Spark restarted exactly this query now
    assert record.batch is None  # the same query as recorded when the checkpoint began: it wrote every batch
    assert profile_path(fm, root) == os.path.join(base.root, ".checkpoint-ops", "checkpoint", "query-profile.json")
    assert tree_snapshot(base.checkpoint, base.output) == spark_files

    code, out, _ = cli("compat", base.checkpoint, "--query", f"{module}:key_changed", "--record")
    assert code == 1 and "not recorded: Spark refuses this query" in out
    assert read_profile(fm, root).judged  # the accepted query stays recorded


@pytest.mark.parametrize("damage, named, problem", [
    ("torn-offsets", "offsets/3", "empty"),
    ("missing-delta", "state/0/1/4.delta", "missing"),
    ("fenced", "checkpoint", "fenced"),
])
def test_damaged_checkpoint_is_unusable_input(agg, damage, named, problem):
    base, module = agg
    ck = base.checkpoint
    if damage == "torn-offsets":
        open(os.path.join(ck, "offsets", "3"), "wb").close()
    elif damage == "missing-delta":
        os.remove(os.path.join(ck, "state", "0", "1", "4.delta"))
        # (Spark's background maintenance may have snapshotted version 4, depending on timing: without the
        # snapshot, the delta is what a restart needs)
        snapshot = os.path.join(ck, "state", "0", "1", "4.snapshot")
        if os.path.exists(snapshot):
            os.remove(snapshot)
    else:
        original = open(os.path.join(ck, "metadata"), "rb").read()
        fence = Fence("rollback", "20260101T000000.000000Z-rollback-abcd1234", "/nowhere/journal", original)
        with open(os.path.join(ck, "metadata"), "wb") as f:
            f.write(fence_bytes(fence, ck))
    before = tree_snapshot(base.root)
    code, out, err = cli("compat", ck, "--query", f"{module}:unchanged", "--json")
    assert code == 2, (out, err)
    doc = json.loads(out)
    assert named in doc["path"] + doc["problem"] and problem in doc["problem"], doc
    assert doc["fix"] and "Traceback" not in err
    assert tree_snapshot(base.root) == before


@pytest.mark.parametrize("query, problem", [
    ("no_colon", "is not MODULE:FUNCTION"),
    ("no_such_module_x:build", "cannot import no_such_module_x"),
    ("{module}:missing", "has no function missing"),
    ("{module}:fails", "the query code has a bug"),
    ("{module}:not_a_writer", "not an unstarted DataStreamWriter"),
])
def test_unusable_query_argument(agg, query, problem):
    base, module = agg
    before = tree_snapshot(base.root)
    code, out, err = cli("compat", base.checkpoint, "--query", query.format(module=module))
    assert code == 2 and problem in err and "fix:" in err and "Traceback" not in err, err
    assert tree_snapshot(base.root) == before


def test_a_spark_conf_that_is_not_key_value_is_refused(agg):
    """``--spark-conf`` was checked only where a new session was built: beside an active one (the Dagster step,
    a notebook, these tests) a slip such as a missing ``=`` was silently ignored."""
    base, module = agg
    code, _, err = cli("compat", base.checkpoint, "--query", f"{module}:unchanged", "--spark-conf", "spark.master")
    assert code == 2 and "--spark-conf 'spark.master' is not KEY=VALUE" in err and "fix:" in err, err


def test_missing_checkpoint(agg, tmp_path):
    _, module = agg
    code, _, err = cli("compat", str(tmp_path / "nothing"), "--query", f"{module}:unchanged")
    assert code == 2 and "no such checkpoint" in err


def test_a_session_compat_creates_keeps_sparks_log_out_of_the_verdict(agg, tmp_path):
    """Run as a process of its own (its own Spark session): a change Spark refuses printed 95 lines of Spark's ERROR
    log and stack trace before the 7-line verdict (a hostile review). The session compat creates logs at FATAL: the
    verdict carries Spark's error class and message; ``--spark-conf spark.log.level=...`` shows the log again."""
    import subprocess
    import sys

    base, module = agg
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, str(tmp_path)]))
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    done = subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", "compat", base.checkpoint, "--query",
                           f"{module}:key_changed", "--spark-conf", "spark.master=local[1]",
                           "--spark-conf", "spark.sql.shuffle.partitions=2"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, (done.stdout, done.stderr[-3000:])
    assert "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE" in done.stdout, done.stdout
    assert "ERROR MicroBatchExecution" not in done.stderr and "\tat org.apache" not in done.stderr, done.stderr[-3000:]


def test_as_of_batch_judges_the_query_where_a_rollback_would_leave_the_checkpoint(agg):
    """``--as-of-batch N``: Spark restarts a copy of the restart set of batch N, and the file sinks the rollback
    takes (``--sink``) are judged to end there too; nothing is read beyond what compat reads, nothing changed."""
    base, module = agg
    before = tree_snapshot(base.root)
    code, doc = cli_json("compat", base.checkpoint, "--query", f"{module}:unchanged", "--as-of-batch", "1",
                         "--sink", base.output)
    assert code == 0 and doc["compatible"] is True and doc["differences"] == [], doc
    assert doc["batch"] == 1 and doc["judge"]["restarted"] and doc["judge"]["batch"] == 2
    assert any("judged as of batch 1" in note for note in doc["notes"]), doc["notes"]
    # the sink not named (and no ledger records it): a rollback would leave its log ahead, and Spark would skip
    # the batches it reprocesses there
    code, doc = cli_json("compat", base.checkpoint, "--query", f"{module}:unchanged", "--as-of-batch", "1")
    assert code == 1 and [(d["aspect"], d["verdict"]) for d in doc["differences"]] == [("sink", "fails-at-restart")]
    assert f"--sink {base.output}" in doc["differences"][0]["fix"], doc["differences"]
    code, out, _ = cli("compat", base.checkpoint, "--query", f"{module}:unchanged", "--as-of-batch", "1")
    assert code == 1 and "FAILS AT RESTART  sink" in out and "fix: roll the sink back" in out, out
    code, out, _ = cli("compat", base.checkpoint, "--query", f"{module}:unchanged", "--as-of-batch", "1", "--sink",
                       base.output)
    assert code == 0 and "as of batch 1, where a rollback to it leaves the checkpoint" in out, out

    code, doc = cli_json("compat", base.checkpoint, "--query", f"{module}:key_changed", "--as-of-batch", "1",
                         "--sink", base.output)
    assert code == 1 and doc["batch"] == 1
    assert [d["error_class"] for d in doc["differences"]] == ["STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"]

    for args, problem in [(["--as-of-batch", "7"], "batch 7 is not a committed batch"),
                          (["--as-of-batch", "1", "--record"], "--record with --as-of-batch")]:
        code, doc = cli_json("compat", base.checkpoint, "--query", f"{module}:unchanged", *args)
        assert code == 2 and problem in doc["problem"], doc
    assert tree_snapshot(base.root) == before, "compat changed files"



def test_a_sink_log_left_ahead_by_a_rollback_fails_with_the_rollback_that_cuts_it(agg):
    """A command-line rollback without ``--sink`` (a warning) leaves the file sink's log ahead of the checkpoint.
    ``compat`` used to call that "silently different" with no fix. For this stateful query (its state ends at the
    checkpoint's batch) it fails at restart, with the fix, in the text and in ``--json``; once the fix, as
    printed, is applied, the query is compatible again. Spark's side of both (the failure, and the exact output
    after the fix) on every state store: ``test_rollback_spark.py``."""
    base, module = agg
    latest = base.batch
    target = latest - 2
    code, doc = cli_json("rollback", base.checkpoint, "--to-batch", str(target), "--yes")
    assert code == 0 and any("no file sink given" in w for w in doc["plan"]["warnings"]), doc
    left_ahead = tree_snapshot(base.root)
    code, doc = cli_json("compat", base.checkpoint, "--query", f"{module}:unchanged")
    assert code == 1 and doc["batch"] == target, doc
    [sink] = doc["differences"]
    assert (sink["aspect"], sink["verdict"], sink["error_class"], sink["rollback_to"]) == \
        ("sink", "fails-at-restart", "CANNOT_LOAD_STATE_STORE", target), sink
    assert f"batches {target + 1}..{latest}" in sink["effect"] and "skips each" in sink["effect"], sink
    command = sink["fix"].split("`")[1]
    assert command == f"checkpoint-ops rollback {base.checkpoint} --to-batch {target} --sink {base.output}", sink
    code, out, _ = cli("compat", base.checkpoint, "--query", f"{module}:unchanged")
    assert code == 1 and "FAILS AT RESTART  sink" in out and f"fix: roll the sink back to the checkpoint's batch " \
        f"{target}" in out, out
    assert tree_snapshot(base.root) == left_ahead, "compat changed files"

    code, doc = cli_json(*command.split()[1:], "--yes")
    assert code == 0, doc
    code, doc = cli_json("compat", base.checkpoint, "--query", f"{module}:unchanged")
    assert code == 0 and doc["compatible"] is True and doc["differences"] == [], doc


def test_a_planned_no_data_batch_the_sink_logged_without_its_state_fails_with_the_rollback_that_cuts_it(spark, agg):
    """The same, where the sink log is ahead by one batch only: the newest batch is a no-data batch (the watermark
    moved on: it evicted windows into the sink), and a rollback to the batch before it without ``--sink`` keeps it
    planned (as a rollback does) and removes its state. That looked like a query stopped between the sink's commit
    and ``commits/`` (the sink's skip is right there: the tasks committed the state first), so ``compat`` said
    compatible and ``fsck`` healthy, and Spark committed the batch without its state and failed at the next one
    (review G). Now both say so, with the rollback that cuts the sink; after it Spark resumes exactly."""
    from pipelines.event_counts import counts_writer, expected_windows, flush_files, read_output, write_event_files
    from tests.compat_queries import restart_for_real

    base, module = agg
    inp, latest = base.dir("input"), base.batch
    target = latest - 1
    assert json.loads(open(os.path.join(base.checkpoint, "offsets", str(latest))).read().split("\n")[2])[
        "logOffset"] == json.loads(open(os.path.join(base.checkpoint, "offsets", str(target))).read().split("\n")[2])[
        "logOffset"], "the newest batch must be a no-data batch"

    def roll_back_without_the_sink():
        code, doc = cli_json("rollback", base.checkpoint, "--to-batch", str(target), "--yes")
        assert code == 0 and doc["plan"]["summary"]["kept_planned"] == [f"offsets/{latest}"], doc

    roll_back_without_the_sink()
    code, doc = cli_json("compat", base.checkpoint, "--query", f"{module}:unchanged")
    assert code == 1 and doc["batch"] == target, doc
    [sink] = doc["differences"]
    assert (sink["aspect"], sink["verdict"], sink["error_class"], sink["rollback_to"]) == \
        ("sink", "fails-at-restart", "CANNOT_LOAD_STATE_STORE", target), sink
    command = sink["fix"].split("`")[1]
    assert command == f"checkpoint-ops rollback {base.checkpoint} --to-batch {target} --sink {base.output}", sink
    code, doc = cli_json("fsck", base.checkpoint, "--sink", base.output)
    assert code == 1 and [(f["code"], f["severity"]) for f in doc["findings"]] == [("sink-ahead", "error")], doc
    assert command in doc["findings"][0]["fix"], doc

    write_event_files(inp, 3, 5)
    flush_files(inp, 4)
    skipped = restart_for_real(spark, counts_writer(spark, inp, base.output), base.checkpoint)
    assert not skipped.ok and "CANNOT_LOAD_STATE_STORE" in skipped.error, skipped.error

    base.reset()
    roll_back_without_the_sink()
    code, doc = cli_json(*command.split()[1:], "--yes")
    assert code == 0, doc
    code, doc = cli_json("compat", base.checkpoint, "--query", f"{module}:unchanged")
    assert code == 0 and doc["differences"] == [], doc
    assert cli_json("fsck", base.checkpoint, "--sink", base.output)[0] == 0
    write_event_files(inp, 3, 5)
    flush_files(inp, 4)
    resumed = restart_for_real(spark, counts_writer(spark, inp, base.output), base.checkpoint)
    assert resumed.ok, resumed.error
    assert read_output(spark, base.output) == {k: [v] for k, v in expected_windows(range(5)).items()}


def test_profiles_recorded_only_after_the_checkpoints_batch_are_named_as_such(agg):
    """After a rollback below every recorded profile, none is the query that wrote the checkpoint's batch. ``compat``
    said "no query profile is recorded for this checkpoint" although one was (review G); it says which batches the
    records are of."""
    base, module = agg
    fm, root = open_file_manager(base.checkpoint)
    os.remove(profile_path(fm, root))  # the base's record (of no known batch) gone: the only one is made now
    code, doc = cli_json("compat", base.checkpoint, "--query", f"{module}:unchanged", "--record")
    assert code == 1 and read_profile(fm, root).batch == base.batch, doc  # recorded (stateful: check by hand)
    latest = base.batch
    code, doc = cli_json("rollback", base.checkpoint, "--to-batch", "0", "--sink", base.output, "--yes")
    assert code == 0, doc
    code, doc = cli_json("compat", base.checkpoint, "--query", f"{module}:unchanged")
    assert code == 1 and doc["recorded_profile"] is None, doc
    assert any(f"all of batches after batch 0 (the newest recorded at batch {latest}" in n for n in doc["notes"]), doc
    assert not any(n.startswith("no query profile recorded") for n in doc["notes"]), doc["notes"]
    [check] = doc["differences"]
    assert check["verdict"] == "check-by-hand" and "the query that wrote batch 0" in check["effect"], check
