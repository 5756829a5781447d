"""The factory's streaming assets on real Spark: materialize, then roll back and reprocess from run config in
one materialization (file sink and foreachBatch), dry runs, refused rollbacks, reprocessing requests filed by
the outcome of their runs, and the backup and compaction jobs around them."""

import datetime
import json
import os

import dagster as dg
import pytest

from checkpoint_ops.activity import RECENT_COMMIT
from checkpoint_ops.backup import Repository, list_backups
from checkpoint_ops.model import Checkpoint
from pipelines.event_counts import (counts_writer, expected_windows, flush_files, read_events, read_output,
                                    windowed_counts, write_bad_event_file, write_event_files)
from dagster_checkpoint_ops.backups import freshness_result
from dagster_checkpoint_ops.streaming import StreamingQuery, streaming_definitions
from tests.dagster_queries import counts_query, expected_totals, read_totals, totals_query
from tests.helpers import tree_snapshot
from tests.spark_runs import FLAVOURS, SESSION_CONF, unload_state_stores
from tests.test_reprocess_sensor import sensor_tick

GOOD_FIRST = 4  # files 0..3 arrive first
BAD = 4  # file 4 arrives bad (values x1000) with good files 5 and 6


@pytest.fixture(scope="module")
def instance():
    with dg.instance_for_test() as inst:
        yield inst


def materialize(defs, name, instance, **config) -> dg.ExecuteInProcessResult:
    run_config = {"ops": {name: {"config": config}}} if config else None
    return defs.resolve_job_def(f"{name}_job").execute_in_process(instance=instance, run_config=run_config,
                                                                   raise_on_error=False)


def metadata(result, name) -> dict:
    (mat,) = result.asset_materializations_for_node(name)
    return {k: v.value for k, v in mat.metadata.items()}


def checks(result) -> dict:
    return {c.check_name: c.passed for c in result.get_asset_check_evaluations()}


def bad_batch_landed(query, defs, instance) -> int:
    """Two runs: good files, then a bad file among good ones. Returns the last batch of the good run."""
    inp = os.path.join(os.path.dirname(query.checkpoint), "input")
    write_event_files(inp, 0, GOOD_FIRST)
    first = materialize(defs, query.name, instance)
    assert first.success, first.all_events
    md = metadata(first, query.name)
    assert md["input_rows"] == GOOD_FIRST * 5 and md["batch_ids"].startswith("0..")
    assert checks(first)["checkpoint_health_check"]
    good_until = md["last_committed_batch"]
    write_bad_event_file(inp, BAD)
    write_event_files(inp, BAD + 1, BAD + 3)
    second = materialize(defs, query.name, instance)
    assert second.success
    assert metadata(second, query.name)["batch_ids"].startswith(f"{good_until + 1}..")
    write_event_files(inp, BAD, BAD + 1)  # upstream delivers the corrected file (same name, same mtime)
    return good_until


@pytest.mark.parametrize("make_query", [counts_query, totals_query], ids=["file_sink", "foreach_batch"])
def test_rollback_and_reprocess_in_one_materialization(spark, tmp_path, instance, make_query):
    query = make_query(str(tmp_path / "q"))
    defs = streaming_definitions([query], home=str(tmp_path / "home"), spark_config=SESSION_CONF)
    good_until = bad_batch_landed(query, defs, instance)
    roots = [query.checkpoint, *query.sinks]

    before = tree_snapshot(*roots)
    dry = materialize(defs, query.name, instance, rollback_to_batch=good_until, dry_run=True)
    assert dry.success
    # observed, not materialized: nothing ran, so nothing downstream or in automation may take it for new data
    assert not dry.asset_materializations_for_node(query.name)
    (observation,) = dry.asset_observations_for_node(query.name)
    md = {k: v.value for k, v in observation.metadata.items()}
    assert md["dry_run"] and md["rollback_target_batch"] == good_until
    assert "| delete |" in md["rollback_plan"] and len(md["rollback_plan_hash"]) == 64
    # the asset ran the query that committed seconds ago, and holds its lease: no word of a query still running
    assert not [w for w in md["rollback_warnings"] if w.startswith(RECENT_COMMIT)], md["rollback_warnings"]
    assert "batches_run" not in md  # the query did not run
    assert "undo_command" not in md and "rollback_op_id" not in md  # a dry run applied nothing to undo
    assert tree_snapshot(*roots) == before, "a dry run changed files"

    result = materialize(defs, query.name, instance, rollback_to_batch=good_until)
    assert result.success
    md = metadata(result, query.name)
    assert md["rollback_plan_hash"] != "" and md["rollback_op_id"]
    # the run reprocessed after its rollback, so undo would refuse: the metadata does not offer it
    assert "undo_command" not in md and "not possible any more" in md["undo"]
    rids = ["checkpoint", *(f"sink{i}" for i in range(len(query.sinks)))]
    assert sorted(md["rollback_requests"]) == sorted(md["rollback_retries"]) == rids  # local disk: none retried
    assert md["rollback_requests"]["checkpoint"] and not any(md["rollback_retries"].values())
    assert md["batch_ids"].startswith(f"{good_until + 1}..")
    # judged where the rollback leaves the checkpoint, before it was applied: the sink log the rollback cuts is
    # not "ahead" there (the judgment as of the newest batch would not have been at that batch)
    assert md["compat"] == "compatible" and md["compat_batch"] == good_until, md
    assert md["input_rows"] == 3 * 5  # the corrected file and the two after it, read again
    assert checks(result)["checkpoint_health_check"]

    unload_state_stores(spark)
    if query.sinks:  # close every window, then the sink must hold each window exactly once, corrected
        flush_files(os.path.join(str(tmp_path / "q"), "input"), BAD + 2)
        assert materialize(defs, query.name, instance).success
        assert read_output(spark, query.sinks[0]) == {k: [v] for k, v in expected_windows(range(BAD + 3)).items()}
    else:
        last = Checkpoint.open(query.checkpoint).latest_commit
        assert read_totals(spark, str(tmp_path / "q" / "output"), last) == expected_totals(range(BAD + 3))


def test_rollback_to_time_dry_run_and_refusals(spark, tmp_path, instance):
    query = counts_query(str(tmp_path / "q"), name="timed")
    defs = streaming_definitions([query], home=str(tmp_path / "home"), spark_config=SESSION_CONF)
    good_until = bad_batch_landed(query, defs, instance)
    roots = [query.checkpoint, *query.sinks]
    before = tree_snapshot(*roots)

    # to_time: the last batch planned at or before that time
    ms = Checkpoint.open(query.checkpoint).offsets(good_until).timestamp_ms
    when = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc).isoformat()
    r = materialize(defs, "timed", instance, rollback_to_time=when, dry_run=True)
    (observation,) = r.asset_observations_for_node("timed")
    assert r.success and observation.metadata["rollback_target_batch"].value == good_until
    # the query judged where the rollback would leave the checkpoint, as the real run does first
    assert observation.metadata["compat"].value == "compatible"
    assert observation.metadata["compat_batch"].value == good_until

    # refused: the run fails with the tool's reason, and nothing changes
    for config, reason in [({"rollback_to_batch": 999}, "999"),
                           ({"rollback_to_time": "yesterday"}, "not an ISO 8601 time"),
                           ({"rollback_to_batch": good_until, "rollback_to_time": when}, "exactly one")]:
        r = materialize(defs, "timed", instance, **config)
        assert not r.success
        failure = r.get_step_failure_events()[0].step_failure_data.user_failure_data
        assert reason in failure.description, failure.description
        assert tree_snapshot(*roots) == before, config

    # code that does not build is caught by the compat step, before the rollback: nothing changes
    def build_fails(spark):
        raise RuntimeError("the query's code is broken")

    broken = StreamingQuery(name="timed", build=build_fails, checkpoint=query.checkpoint, sinks=query.sinks)
    r = materialize(streaming_definitions([broken], home=str(tmp_path / "home"), spark_config=SESSION_CONF), "timed",
                    instance, rollback_to_batch=good_until)
    failure = r.get_step_failure_events()[0].step_failure_data.user_failure_data
    assert not r.success and "broken" in failure.description and "nothing changed" in failure.description
    assert tree_snapshot(*roots) == before

    # applied, then the run stops before its query starts (here, with the compat step skipped, its build fails
    # after the rollback): the failure says the rollback stands, not the build error's "nothing ran, nothing
    # changed" alone
    r = materialize(streaming_definitions([broken], home=str(tmp_path / "home"), spark_config=SESSION_CONF), "timed",
                    instance, rollback_to_batch=good_until, skip_compat_check=True)
    failure = r.get_step_failure_events()[0].step_failure_data.user_failure_data
    assert not r.success and f"rollback to batch {good_until} (" in failure.description, failure.description
    assert "was applied in this run and stands" in failure.description and "broken" in failure.description
    assert "WITHOUT rollback_to_batch" in failure.description and "nothing changed" not in failure.description
    op_id = failure.metadata["rollback_op_id"].value  # nothing ran since: the way back is named too
    assert f"`checkpoint-ops undo {query.checkpoint} --op {op_id}`" in failure.description, failure.description
    assert Checkpoint.open(query.checkpoint).latest_commit == good_until
    unload_state_stores(spark)


def test_reprocess_requests_are_filed_by_the_outcome_of_their_runs(spark, spark_runs, tmp_path, instance):
    """The sensor's requests run as the real streaming job on a checkpoint Spark wrote: one for a batch the
    checkpoint never had fails (the rollback is refused, nothing changes) and lands in failed/ with the
    refusal; the other rolls back, reprocesses and lands in handled/."""
    run = spark_runs("hdfs")
    run.reset()

    def build(session):
        for k, v in FLAVOURS["hdfs"].items():
            session.conf.set(k, v)
        return counts_writer(session, run.input, run.output)

    query = StreamingQuery(name="generated", build=build, checkpoint=run.checkpoint, sinks=[run.output])
    home = str(tmp_path / "home")
    defs = streaming_definitions([query], home=home, spark_config=SESSION_CONF)
    folder = os.path.join(home, "reprocess-requests")
    os.makedirs(folder)
    target = run.last_batch - 1
    for name, doc in [("missing.json", {"asset": "generated", "to_batch": 999, "id": "INC-1"}),
                      ("redo.json", {"asset": "generated", "to_batch": target, "id": "INC-2"})]:
        with open(os.path.join(folder, name), "w") as f:
            json.dump(doc, f)
    try:
        tick = sensor_tick(defs, instance)
        results = {}
        for request in tick.run_requests:  # as the daemon launches them: the request's tags and run key
            results[request.run_key] = defs.resolve_job_def(request.job_name).execute_in_process(
                instance=instance, run_config=request.run_config, raise_on_error=False,
                tags={**request.tags, "dagster/run_key": request.run_key})
        assert set(results) == {"generated:INC-1", "generated:INC-2"}
        failed, redone = results["generated:INC-1"], results["generated:INC-2"]
        assert not failed.success and redone.success
        refusal = failed.get_step_failure_events()[0].step_failure_data.user_failure_data.description
        assert refusal.startswith("rollback refused") and "999" in refusal
        md = metadata(redone, "generated")
        assert md["rollback_target_batch"] == target and md["batch_ids"].startswith(f"{target + 1}..")

        filed = sensor_tick(defs, instance, tick.cursor)
        assert filed.run_requests == [] and sorted(os.listdir(folder)) == ["failed", "handled"]
        with open(os.path.join(folder, "failed", "missing.json.reason.txt")) as f:
            note = f.read()
        assert note.startswith(f"failed: run {failed.run_id} of generated_job (run_key generated:INC-1) ended FAILURE")
        assert f"reason: {refusal}" in note
        with open(os.path.join(folder, "handled", "redo.json.reason.txt")) as f:
            assert f.read().startswith(f"succeeded: run {redone.run_id} of generated_job (run_key generated:INC-2)")
    finally:
        unload_state_stores(spark)
        run.reset()


def test_backup_and_compaction_jobs(spark, tmp_path, instance):
    query = counts_query(str(tmp_path / "q"), name="kept")
    home = str(tmp_path / "home")
    defs = streaming_definitions([query], home=home, spark_config=SESSION_CONF)
    write_event_files(str(tmp_path / "q" / "input"), 0, 12)
    flush_files(str(tmp_path / "q" / "input"), 11)
    first = materialize(defs, "kept", instance)
    assert first.success
    assert checks(first)["backup_freshness_check"] is False  # evaluated in the step: no backup yet
    unload_state_stores(spark)
    out_before = read_output(spark, query.sinks[0])

    r = defs.resolve_job_def("checkpoint_backup_job").execute_in_process(instance=instance)
    assert r.success
    (obs,) = [e for e in r.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    md = obs.event_specific_data.asset_observation.metadata
    assert md["backup_verified"].value and md["backup_files"].value > 0
    assert md["backup_repaired_objects"].value == 0  # a fresh destination has no leftover to repair
    assert md["backup_retries"].value == {"destination": {}, "checkpoint": {}, "sink0": {}}  # the ledger: checkpoint's
    rows = list_backups(Repository.open(os.path.join(home, "backups", "kept")))
    assert [b.id for b in rows] == [md["backup_id"].value]

    # the freshness check (which failed in the first materialization: no backup yet) now passes
    res = freshness_result(query, defs.resources["streaming_settings"], defs.resources["checkpoint_files"])
    assert res.passed, res.description

    r = defs.resolve_job_def("sink_compaction_job").execute_in_process(instance=instance)
    assert r.success
    log = os.listdir(os.path.join(query.sinks[0], "_spark_metadata"))
    assert any(n.endswith(".compact") for n in log), log
    assert read_output(spark, query.sinks[0]) == out_before
    write_event_files(str(tmp_path / "q" / "input"), 12, 13)  # Spark resumes on the compacted log
    assert materialize(defs, "kept", instance).success
    unload_state_stores(spark)
    assert read_output(spark, query.sinks[0]) == out_before


def test_failed_run_records_fsck_findings(spark, tmp_path, instance):
    query = counts_query(str(tmp_path / "q"), name="broken")
    defs = streaming_definitions([query], home=str(tmp_path / "home"), spark_config=SESSION_CONF)
    write_event_files(str(tmp_path / "q" / "input"), 0, 3)
    assert materialize(defs, "broken", instance).success
    unload_state_stores(spark)
    latest = Checkpoint.open(query.checkpoint).latest_offset
    path = os.path.join(query.checkpoint, "offsets", str(latest))
    with open(path, "r+b") as f:  # a torn write: Spark cannot restart from it
        f.truncate(20)
    os.remove(os.path.join(query.checkpoint, "offsets", f".{latest}.crc"))

    # launched as the asset's job, and as the UI's Materialize button does (the implicit asset job)
    by_ui = defs.resolve_implicit_global_asset_job_def().execute_in_process(
        instance=instance, asset_selection=[dg.AssetKey("broken")], raise_on_error=False)
    for failed in (materialize(defs, "broken", instance), by_ui):
        assert not failed.success
        description = failed.get_step_failure_events()[0].step_failure_data.user_failure_data.description
        # the compat step finds the torn file before Spark starts, and names it
        assert description.startswith("compat check of broken could not judge the checkpoint"), description
        assert f"offsets/{latest}" in description
        unload_state_stores(spark)

        sensor = defs.resolve_sensor_def("checkpoint_failure_sensor")
        ctx = dg.build_run_status_sensor_context(
            sensor_name=sensor.name, dagster_instance=instance, dagster_run=failed.dagster_run,
            dagster_event=failed.get_run_failure_event(),
            resources={"checkpoint_files": defs.resources["checkpoint_files"]}).for_run_failure()
        sensor(ctx)
        (obs,) = instance.fetch_observations(dg.AssetKey("broken"), limit=1).records
        md = obs.asset_observation.metadata
        assert md["errors"].value >= 1
        assert any(f["path"].endswith(f"offsets/{latest}") for f in md["findings"].value), md["findings"].value
        assert md["failed_run"].value == failed.dagster_run.run_id


def test_secrets_appear_nowhere(spark, tmp_path, s3_server, monkeypatch, capfd):
    """A sentinel storage secret and Spark Connect token pass through the resources and show up in none of:
    the code location the UI reads, run config, metadata, event logs, captured logs, plans, journals,
    backups, or the process output."""
    secret, token = "sentinel-secret-5f0d0c2e", "sentinel-token-a41b9e77"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)  # the S3 server accepts any secret
    monkeypatch.setenv("SPARK_CONNECT_TOKEN", token)
    import boto3

    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket="secret-backups")
    query = counts_query(str(tmp_path / "q"), name="guarded")
    home = tmp_path / "home"
    defs = streaming_definitions([query], home=str(home), backup_url="s3://secret-backups/b",
                                 spark_config=SESSION_CONF)
    with dg.instance_for_test() as inst:
        good_until = bad_batch_landed(query, defs, inst)
        assert materialize(defs, "guarded", inst, rollback_to_batch=good_until).success
        unload_state_stores(spark)
        assert defs.resolve_job_def("checkpoint_backup_job").execute_in_process(instance=inst).success
        files = defs.resources["checkpoint_files"]
        assert isinstance(files.secret, dg.EnvVar)
        with dg.build_resources({"checkpoint_files": files}) as live:  # as a run resolves it
            assert live.checkpoint_files.options()["secret"] == secret  # the secret reaches the storage client

        from dagster._core.remote_representation.external_data import RepositorySnap
        from dagster._serdes import serialize_value

        ui = serialize_value(RepositorySnap.from_def(defs.get_repository_def()))
        assert "AWS_SECRET_ACCESS_KEY" in ui and "SPARK_CONNECT_TOKEN" in ui  # the UI names the variables...
        assert secret not in ui and token not in ui  # ...never their values
        texts = {"code location": ui}
        for record in inst.get_run_records():
            run_id = record.dagster_run.run_id
            texts[f"run config {run_id}"] = json.dumps(record.dagster_run.run_config)
            texts[f"events {run_id}"] = "\n".join(serialize_value(e) for e in inst.all_logs(run_id))
        stored = _file_bytes(inst.root_directory, str(tmp_path))  # sqlite storage, captured logs, data
        s3 = boto3.client("s3", endpoint_url=s3_server)
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="secret-backups").get("Contents", [])]
        assert any(k.endswith(".json") for k in keys)
        stored.update({f"s3://secret-backups/{k}": s3.get_object(Bucket="secret-backups", Key=k)["Body"].read()
                       for k in keys})
    out = capfd.readouterr()
    texts.update({"stdout": out.out, "stderr": out.err})
    for where, text in texts.items():
        assert secret not in text and token not in text, where
    journals = [p for p in stored if "/.checkpoint-ops/" in p]
    assert journals, "expected the rollback's journal and plan among the files searched"
    for where, data in stored.items():
        assert secret.encode() not in data and token.encode() not in data, where


def _file_bytes(*roots: str) -> dict[str, bytes]:
    out = {}
    for root in roots:
        for d, _, names in os.walk(root):
            for n in names:
                with open(os.path.join(d, n), "rb") as f:
                    out[os.path.join(d, n)] = f.read()
    return out


_KILLED_RUN = """
import sys
import dagster as dg
from dagster_checkpoint_ops import streaming_definitions
from tests.dagster_queries import counts_query
from tests.spark_runs import SESSION_CONF

query = counts_query(sys.argv[1])
defs = streaming_definitions([query], home=sys.argv[2], spark_config=SESSION_CONF)
with dg.instance_for_test() as instance:
    defs.resolve_job_def(f"{query.name}_job").execute_in_process(instance=instance)
"""


def test_a_killed_materialization_leaves_a_lease_the_next_run_takes_over(spark, tmp_path, instance):
    """kill -9 of a whole materialization (its process group: Python and Spark's JVM) while it holds the
    checkpoint's lease: the lease stays, `lease show` calls it stale (its pid is dead), and the next run
    takes it over with a warning in its log and completes, with no row lost or counted twice."""
    import logging
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers import cli_json

    base, home = str(tmp_path / "q"), str(tmp_path / "home")
    query = counts_query(base)
    write_event_files(os.path.join(base, "input"), 0, GOOD_FIRST)
    lease = os.path.join(query.checkpoint, ".checkpoint-ops.lease")
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_RUN, base, home], cwd=os.getcwd(),
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while not os.path.exists(lease):
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the materialization never took the checkpoint's lease"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    assert os.path.exists(lease), "the killed run's lease is gone: nothing was left to take over"

    code, shown = cli_json("lease", "show", query.checkpoint)
    assert code == 0, shown
    assert shown["state"] == "stale" and shown["holder"]["pid"] == proc.pid, shown
    assert "dagster run" in shown["holder"]["owner"] and "is gone" in shown["stale_reason"], shown

    defs = streaming_definitions([query], home=home, spark_config=SESSION_CONF)
    result = materialize(defs, query.name, instance)
    assert result.success, result.all_events
    warnings = [e.user_message for e in instance.all_logs(result.run_id) if e.level == logging.WARNING]
    assert any("took over the lease" in w and f"pid {proc.pid}" in w and "is gone" in w for w in warnings), warnings
    assert not os.path.exists(lease), "the run released the lease it took over"
    inp = os.path.join(base, "input")
    write_event_files(inp, GOOD_FIRST, GOOD_FIRST + 2)
    flush_files(inp, GOOD_FIRST + 1)
    unload_state_stores(spark)
    assert materialize(defs, query.name, instance).success
    got = read_output(spark, query.sinks[0])
    want = {k: [v] for k, v in expected_windows(range(GOOD_FIRST + 2)).items()}
    assert got == want, "rows lost or counted twice after the takeover"


def test_a_first_run_stopped_while_spark_wrote_its_metadata_runs_again(spark, tmp_path, instance):
    """A first materialization killed while Spark wrote the checkpoint's first ``metadata`` (CI caught the kill
    above landing there) leaves the temp file of that write, and its ``.crc``, and nothing else Spark reads.
    Spark starts such a query afresh. Before, the compat check called the location "not a Structured Streaming
    checkpoint" and refused every later run until someone deleted the file by hand; now the health check says
    "not run yet", the run succeeds with every row counted once, and fsck only warns of the temp file."""
    import uuid

    from checkpoint_ops.storage.checksums import hadoop_crc_bytes
    from tests.helpers import cli_json

    base, home = str(tmp_path / "q"), str(tmp_path / "home")
    query = counts_query(base)
    write_event_files(os.path.join(base, "input"), 0, GOOD_FIRST)
    os.makedirs(query.checkpoint)
    temp = f".metadata.{uuid.uuid4()}.tmp"
    part = b'{"id":"'  # Spark's metadata record, cut off mid-write
    with open(os.path.join(query.checkpoint, temp), "wb") as f:
        f.write(part)
    with open(os.path.join(query.checkpoint, f".{temp}.crc"), "wb") as f:
        f.write(hadoop_crc_bytes(part))

    code, shown = cli_json("inspect", query.checkpoint)
    assert code == 2 and "no checkpoint yet: only the temp file of a write that never finished" in shown["problem"] \
        and temp in shown["problem"], shown
    defs = streaming_definitions([query], home=home, spark_config=SESSION_CONF)
    result = materialize(defs, query.name, instance)
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    assert checks(result)["checkpoint_health_check"]
    inp = os.path.join(base, "input")
    write_event_files(inp, GOOD_FIRST, GOOD_FIRST + 2)
    flush_files(inp, GOOD_FIRST + 1)  # the watermark passes the last window of the first files
    unload_state_stores(spark)
    assert materialize(defs, query.name, instance).success
    got = read_output(spark, query.sinks[0])
    assert got == {k: [v] for k, v in expected_windows(range(GOOD_FIRST + 2)).items()}, "rows lost or counted twice"
    code, report = cli_json("fsck", query.checkpoint, "--sink", query.sinks[0])
    found = [f for f in report["findings"] if f["severity"] != "info"]
    assert code == 1 and [(f["severity"], f["code"]) for f in found] == [("warning", "temp-file")], found


def test_a_fenced_checkpoint_fails_the_run_with_how_to_finish_it(spark, tmp_path, instance):
    """A rollback killed after it fenced the checkpoint: the next materialization fails before Spark starts,
    naming the interrupted operation and the command that finishes it, with the compat check (its own
    refusal) and without it (``skip_compat_check``: the run's one read of ``metadata``), and changes
    nothing; the advised command finishes the rollback and the next run reprocesses exactly."""
    import subprocess
    import sys

    from tests.helpers import cli_json

    base, home = str(tmp_path / "q"), str(tmp_path / "home")
    query = counts_query(base, name="fenced")
    defs = streaming_definitions([query], home=home, spark_config=SESSION_CONF)
    inp = os.path.join(base, "input")
    write_event_files(inp, 0, GOOD_FIRST)
    first = materialize(defs, "fenced", instance)
    assert first.success, first.all_events
    good_until = metadata(first, "fenced")["last_committed_batch"]
    write_event_files(inp, GOOD_FIRST, GOOD_FIRST + 2)
    assert materialize(defs, "fenced", instance).success
    unload_state_stores(spark)

    intervals = ["--source-compact-interval", "5", "--sink-compact-interval", "5"]
    env = dict(os.environ, CHECKPOINT_OPS_KILL_AT="12")  # after the fence (calls 9, 10) and one file moved aside
    killed = subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", "rollback", query.checkpoint, "--to-batch",
                             str(good_until), "--sink", query.sinks[0], *intervals, "--yes", "--json"],
                            env=env, capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr[-2000:]
    with open(os.path.join(query.checkpoint, "metadata"), "rb") as f:
        assert f.read().startswith(b"CHECKPOINT-OPS-FENCE"), "the rollback was not killed after its fence"
    roots = [query.checkpoint, *query.sinks]

    def files_spark_reads() -> dict:  # the killed rollback's leases are taken over (and released) by the run
        return {p: v for p, v in tree_snapshot(*roots).items() if ".checkpoint-ops.lease" not in p}

    before = files_spark_reads()
    resume = f"checkpoint-ops resume {query.checkpoint}"
    for config, opening in [({}, "compat check of fenced could not judge the checkpoint"),
                            ({"skip_compat_check": True}, f"{query.checkpoint}: an interrupted checkpoint-ops rollback")]:
        r = materialize(defs, "fenced", instance, **config)
        assert not r.success
        description = r.get_step_failure_events()[0].step_failure_data.user_failure_data.description
        assert description.startswith(opening) and "fenced this checkpoint" in description, description
        assert resume in description, description
        assert files_spark_reads() == before, config

    code, resumed = cli_json("resume", query.checkpoint, *intervals)
    assert code == 0, resumed
    flush_files(inp, GOOD_FIRST + 1)  # evicts every real window of the reprocessed files
    assert materialize(defs, "fenced", instance).success
    got = read_output(spark, query.sinks[0])
    assert got == {k: [v] for k, v in expected_windows(range(GOOD_FIRST + 2)).items()}
    unload_state_stores(spark)


def test_a_rollback_right_after_a_run_failed_mid_batch_is_not_refused(spark, tmp_path, instance):
    """The query fails on a poison record mid-batch: the run leaves ``offsets/N`` planned, uncommitted and
    seconds old, and ends (its lease released). Before, a rollback run right after it was refused for ten
    minutes ("the query looks active") with no override in the run config. The failed run records the batch it
    left planned, so the rollback goes ahead (tests/test_force_warnings.py: that file changed looks active again)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from checkpoint_ops.activity import active_reasons

    base = str(tmp_path / "q")
    inp, out, ckpt = (os.path.join(base, d) for d in ("input", "output", "checkpoint"))

    @F.udf(T.LongType())
    def refuse_poison(value):
        if value is not None and value < 0:
            raise ValueError(f"poison value {value}")
        return value

    def build(spark):
        for k, v in FLAVOURS["hdfs"].items():
            spark.conf.set(k, v)
        events = read_events(spark, inp).withColumn("value", refuse_poison("value"))
        return windowed_counts(events).writeStream.format("parquet").outputMode("append").option("path", out)

    defs = streaming_definitions([StreamingQuery(name="poisoned", build=build, checkpoint=ckpt, sinks=[out])],
                                 home=str(tmp_path / "home"), spark_config=SESSION_CONF)
    write_event_files(inp, 0, 3)
    assert materialize(defs, "poisoned", instance).success
    good = max(int(n) for n in os.listdir(os.path.join(ckpt, "commits")) if n.isdigit())
    poison = os.path.join(inp, "events-00003.json")
    with open(poison, "w") as f:
        f.write(json.dumps({"key": "k0", "value": -1, "ts": "2024-01-01T00:10:00"}) + "\n")
    os.utime(poison, (2_000_000_000, 2_000_000_000))
    failed = materialize(defs, "poisoned", instance)
    assert not failed.success
    unload_state_stores(spark)
    planned = max(int(n) for n in os.listdir(os.path.join(ckpt, "offsets")) if n.isdigit())
    assert planned == good + 1 and not os.path.exists(os.path.join(ckpt, "commits", str(planned)))
    assert active_reasons(Checkpoint.open(ckpt)) == []  # the failed run's own batch: no sign of a query running
    os.remove(poison)  # on call fixes the input, then rolls back to the last good batch at once
    rolled = materialize(defs, "poisoned", instance, rollback_to_batch=good)
    assert rolled.success, [e.message for e in rolled.all_events if e.is_failure]
    assert metadata(rolled, "poisoned")["rollback_target_batch"] == good
    unload_state_stores(spark)


def test_a_run_whose_lease_is_taken_while_its_query_runs_stops_the_query(spark, tmp_path, instance, monkeypatch):
    """Another host took the run's lease over while its query ran (the run's heartbeat lapsed: its process was
    paused, or cut off from the lease's store, for longer than the time to live). The run finds the record not its
    own at its next renewal, stops the query there and fails, naming the holder; it writes nothing more under the
    lease and leaves the record alone. Once that holder is done, the next run finishes the input exactly once."""
    import threading
    import time

    from checkpoint_ops.lease import LEASE_NAME
    from checkpoint_ops.liveness import Holder
    from tests.helpers import cli_json

    monkeypatch.setenv("CHECKPOINT_OPS_LEASE_TTL", "1")  # the run renews every third of a second, looks every second
    base = str(tmp_path / "q")
    # HDFS state: stopped between its file sink's commit of a batch and the commit log, a query with RocksDB state
    # checkpoint format V2 is not restarted by Spark 4.3 (the re-run batch, skipped by the sink, reports no state
    # checkpoint ids: "CheckpointInfo length: 0"), whatever stopped it; this test is about the lease
    query, inp = counts_query(base, name="taken", flavour="hdfs"), os.path.join(base, "input")
    files = 24  # one batch each: seconds of work, so the query still runs when the lease is taken
    write_event_files(inp, 0, files)
    lease, first_commit = os.path.join(query.checkpoint, LEASE_NAME), os.path.join(query.checkpoint, "commits", "0")
    now = int(time.time() * 1000)
    other = Holder("checkpoint-ops rollback", "another-host.example", 4242, None, "beef" * 8, now, now, 600.0, None)

    def take_over() -> None:  # as that host does once the run's record is stale: its own record in its place
        deadline = time.monotonic() + 300
        while not os.path.exists(first_commit) and time.monotonic() < deadline:
            time.sleep(0.02)
        for _ in range(20):  # on local disk a renewal under way may land over it (lease.py): place it again
            with open(lease + ".taker", "w") as f:
                json.dump(other.to_dict(), f)
            os.replace(lease + ".taker", lease)
            time.sleep(0.2)
            with open(lease) as f:
                if json.load(f)["token"] == other.token:
                    return

    taker = threading.Thread(target=take_over, daemon=True)
    taker.start()
    defs = streaming_definitions([query], home=str(tmp_path / "home"), spark_config=SESSION_CONF)
    failed = materialize(defs, "taken", instance)
    taker.join(timeout=60)
    assert not failed.success
    failure = failed.get_step_failure_events()[0].step_failure_data.user_failure_data
    assert "streaming query taken was stopped" in failure.description, failure.description
    assert "taken from this process" in failure.description and "another-host.example" in failure.description
    assert f"lease show {query.checkpoint}" in failure.description, failure.description
    committed = Checkpoint.open(query.checkpoint).latest_commit
    assert committed is not None and committed < files - 1, f"the query ran on to batch {committed} without its lease"
    with open(lease) as f:
        assert json.load(f)["token"] == other.token  # the run's release left the holder's record alone
    unload_state_stores(spark)

    code, broken = cli_json("lease", "break", query.checkpoint, "--yes")  # that holder is done (and gone)
    assert code == 0, broken
    flush_files(inp, files - 1)
    again = materialize(defs, "taken", instance)
    assert again.success, [e.message for e in again.all_events if e.is_failure]
    unload_state_stores(spark)
    want = {k: [v] for k, v in expected_windows(range(files)).items()}
    assert read_output(spark, query.sinks[0]) == want, "rows lost or counted twice after the lease was taken"


def test_a_run_stopped_after_its_sink_commit_on_format_v2_is_refused_and_one_rollback_materialization_repairs_it(
        spark, tmp_path, instance):
    """A run stopped between the file sink's commit of a batch and ``commits/N`` (a kill, or the lease-loss stop)
    leaves a checkpoint that Spark 4.3 cannot restart on RocksDB checkpoint format V2 ('CheckpointInfo length: 0',
    test_stopped_after_sink_commit_spark.py). The next materialization refuses before Spark starts, naming the run
    config that repairs it; a materialization with that config rolls back and runs; no row is lost or counted
    twice. The stop is made by removing ``commits/N`` (Spark's last write of a batch) after a good run."""
    import logging
    import time

    base, home = str(tmp_path / "q"), str(tmp_path / "home")
    query = counts_query(base, name="halfway")
    defs = streaming_definitions([query], home=home, spark_config=SESSION_CONF)
    inp = os.path.join(base, "input")
    write_event_files(inp, 0, GOOD_FIRST)
    first = materialize(defs, query.name, instance)
    assert first.success, first.all_events
    last = metadata(first, query.name)["last_committed_batch"]
    for name in (str(last), f".{last}.crc"):
        os.remove(os.path.join(query.checkpoint, "commits", name))
    unload_state_stores(spark)

    refused = materialize(defs, query.name, instance)
    assert not refused.success
    (failure,) = [e for e in refused.all_events if e.event_type_value == "STEP_FAILURE"]
    text = failure.event_specific_data.error.message
    assert "CheckpointInfo length: 0" in text and f"rollback_to_batch: {last - 1}" in text, text
    assert "skip_compat_check" not in text, text  # Spark would fail: not offered

    # offsets/{last} was written moments ago: the rollback takes it for a running batch for ten minutes
    still = materialize(defs, query.name, instance, rollback_to_batch=last - 1)
    assert not still.success
    (failure,) = [e for e in still.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "probably running" in failure.event_specific_data.error.message and "600 s old" in \
        failure.event_specific_data.error.message
    planned = os.path.join(query.checkpoint, "offsets", str(last))
    eleven_minutes_ago = time.time() - 660  # the on-call engineer acts later
    os.utime(planned, (eleven_minutes_ago, eleven_minutes_ago))

    repaired = materialize(defs, query.name, instance, rollback_to_batch=last - 1)
    assert repaired.success, [e.user_message for e in instance.all_logs(repaired.run_id)
                              if e.level >= logging.WARNING]
    assert metadata(repaired, query.name)["batch_ids"].startswith(f"{last}..")
    write_event_files(inp, GOOD_FIRST, GOOD_FIRST + 2)
    flush_files(inp, GOOD_FIRST + 1)
    unload_state_stores(spark)
    assert materialize(defs, query.name, instance).success
    want = {k: [v] for k, v in expected_windows(range(GOOD_FIRST + 2)).items()}
    assert read_output(spark, query.sinks[0]) == want, "rows lost or counted twice after the repair"
