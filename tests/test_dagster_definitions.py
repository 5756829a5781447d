"""The factory's definitions without Spark: what they contain, the launchpad config, the schedules, and the
workspace as the dagster CLI loads it (the reprocessing sensor: test_reprocess_sensor.py)."""

import datetime
import os
import re
import shutil
import subprocess
import sys

import dagster as dg
import pytest

from dagster_checkpoint_ops.query import StreamingQuery
from dagster_checkpoint_ops.streaming import streaming_definitions

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _build(spark):  # never called here
    raise AssertionError("no Spark in these tests")


def make_defs(home, names=("alpha", "beta"), **kw) -> dg.Definitions:
    queries = [StreamingQuery(name=n, build=_build, checkpoint=f"{home}/ckpt/{n}",
                              sinks=[f"{home}/out/{n}"] if n != "beta" else []) for n in names]
    return streaming_definitions(queries, home=str(home), **kw)


def test_example_definitions_hold_everything_the_ui_shows():
    from pipelines.definitions import defs

    dg.Definitions.validate_loadable(defs)
    repo = defs.get_repository_def()
    assert {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()} == {"events_stream", "event_counts"}
    assert {(k.asset_key.to_user_string(), k.name) for k in repo.asset_graph.asset_check_keys} == {
        (a, c) for a in ("events_stream", "event_counts")
        for c in ("checkpoint_health_check", "backup_freshness_check", "restore_drill_check")}
    jobs = {j.name for j in repo.get_all_jobs()}
    assert {"checkpoint_backup_job", "sink_compaction_job", "checkpoint_restore_drill_job", "events_stream_job",
            "event_counts_job"} <= jobs
    schedules = {s.name: s for s in repo.schedule_defs}
    assert schedules["checkpoint_backup_schedule"].default_status == dg.DefaultScheduleStatus.RUNNING
    assert schedules["checkpoint_restore_drill_schedule"].default_status == dg.DefaultScheduleStatus.RUNNING
    assert schedules["checkpoint_restore_drill_schedule"].job_name == "checkpoint_restore_drill_job"
    assert "sink_compaction_schedule" in schedules
    sensors = {s.name: s for s in repo.sensor_defs}
    assert sensors["reprocess_request_sensor"].default_status == dg.DefaultSensorStatus.RUNNING
    assert "checkpoint_failure_sensor" in sensors


def test_one_pool_per_checkpoint(tmp_path):
    """Streaming run (and its rollback), backup, compaction and health check of a query share its pool."""
    defs = make_defs(tmp_path)
    repo = defs.get_repository_def()
    pools = {}
    for job in repo.get_all_jobs():
        for node in job.graph.iterate_op_defs():
            pools[node.name] = node.pool
    assert pools["alpha"] == pools["backup_alpha"] == pools["compact_alpha"] == "checkpoint-alpha"
    # the health check is evaluated in the asset's own step (on its pass), so in the same pool
    checks = {(k.asset_key.to_user_string(), k.name) for k in repo.assets_defs_by_key[dg.AssetKey("alpha")].check_keys}
    assert ("alpha", "checkpoint_health_check") in checks
    assert pools["beta"] == pools["backup_beta"] == "checkpoint-beta"
    assert "compact_beta" not in pools  # beta has no file sink


def run_checks_only(defs, name="alpha") -> tuple[dg.ExecuteInProcessResult, dict]:
    only_checks = dg.define_asset_job(f"{name}_checks_job", selection=dg.AssetSelection.checks_for_assets(name))
    job = dg.Definitions.merge(defs, dg.Definitions(jobs=[only_checks])).resolve_job_def(f"{name}_checks_job")
    result = job.execute_in_process(instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
    return result, {c.check_name: c for c in result.get_asset_check_evaluations()}


def test_a_check_run_on_its_own_starts_neither_spark_nor_the_query(tmp_path):
    """Executing the asset's checks without the asset (the UI's Execute on a check) evaluates just them: the
    query is not built (``_build`` raises) and no Spark session starts (its master URL is not one).
    On a directory that holds no checkpoint of a query that never ran, the health check passes saying so
    (the first run creates it); a backup is still missing (a warning)."""
    defs = make_defs(tmp_path, names=("alpha",), spark_config={"spark.master": "no-such-master"})
    os.makedirs(tmp_path / "ckpt" / "alpha")
    result, verdicts = run_checks_only(defs)
    assert not result.asset_materializations_for_node("alpha")
    assert set(verdicts) == {"checkpoint_health_check", "backup_freshness_check", "restore_drill_check"}
    health = verdicts["checkpoint_health_check"]
    assert health.passed and health.description.startswith("not run yet: nothing at ")
    assert str(tmp_path / "ckpt" / "alpha") in health.description
    assert not verdicts["backup_freshness_check"].passed and "no backup" in verdicts["backup_freshness_check"].description
    assert verdicts["backup_freshness_check"].severity == dg.AssetCheckSeverity.WARN
    assert result.success, [e.message for e in result.all_events if e.is_failure]


def test_the_health_check_of_a_location_holding_only_an_unfinished_first_write_says_not_run_yet(tmp_path):
    """A first run stopped while Spark wrote the checkpoint's first ``metadata`` leaves only that write's temp file
    and its ``.crc``: Spark never reads them and starts the query afresh there, so the health check passes, as for
    an empty location (before: fsck's "not a Spark checkpoint" failed it, blocking every later run)."""
    defs = make_defs(tmp_path, names=("alpha",), spark_config={"spark.master": "no-such-master"})
    ckpt = tmp_path / "ckpt" / "alpha"
    os.makedirs(ckpt)
    (ckpt / ".metadata.5f0c1b9e-0d7e-4c55-9b57-3f1a9f1c2d11.tmp").write_bytes(b'{"id":"')
    (ckpt / "..metadata.5f0c1b9e-0d7e-4c55-9b57-3f1a9f1c2d11.tmp.crc").write_bytes(b"crc\0")
    _result, verdicts = run_checks_only(defs)
    health = verdicts["checkpoint_health_check"]
    assert health.passed and health.description.startswith("not run yet: nothing at "), health.description
    # a temp file in offsets/ is not that: Spark refuses to start a new query while offsets/ holds anything, so the
    # location is left to fsck to judge
    from checkpoint_ops.query_owner import not_started
    from checkpoint_ops.storage import open_file_manager

    os.makedirs(ckpt / "offsets")
    (ckpt / "offsets" / ".0.5f0c1b9e-0d7e-4c55-9b57-3f1a9f1c2d11.tmp").write_bytes(b"v1")
    assert not_started(*open_file_manager(str(ckpt)), "alpha") is None


def test_a_missing_checkpoint_fails_the_health_check_once_the_query_ran_or_its_sink_has_a_log(tmp_path):
    """Nothing at the checkpoint's location is unsafe when the asset's query ran there before (its owner
    record, and the batch ledger its run's pass synced, say so: a run now starts again from batch 0 and reads
    all its input again), or when a declared sink already logs batches (a new query would skip those batch ids:
    their rows never reach the output). Either fails the blocking health check, naming the file that shows it,
    and changes nothing. The owner record alone (written just before the query starts; a run refused before
    Spark wrote anything leaves it) is no sign the query ran."""
    from benchmarks import synthetic
    from checkpoint_ops.query_owner import claim
    from checkpoint_ops.storage.registry import open_file_manager
    from tests.helpers import cli_json, tree_snapshot

    defs = make_defs(tmp_path, names=("alpha",), spark_config={"spark.master": "no-such-master"})
    ckpt = str(tmp_path / "ckpt" / "alpha")
    os.makedirs(tmp_path / "out" / "alpha" / "_spark_metadata")
    (tmp_path / "out" / "alpha" / "_spark_metadata" / "0").write_text('v1\n{"path":"file:/x/part-0.parquet",'
                                                                     '"size":1,"isDir":false,"modificationTime":1,'
                                                                     '"blockReplication":1,"blockSize":1,"action":"add"}\n')
    before = tree_snapshot(str(tmp_path))
    result, verdicts = run_checks_only(defs)
    health = verdicts["checkpoint_health_check"]
    assert not health.passed and health.severity == dg.AssetCheckSeverity.ERROR
    assert "already logs batches 0..0" in health.description and "skip those batch ids" in health.description
    assert health.metadata["path"].value.endswith(str(tmp_path / "out" / "alpha"))
    assert "empty output directory" in health.metadata["fix"].value
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    assert "blocking asset check failed" in failure.step_failure_data.error.message
    assert tree_snapshot(str(tmp_path)) == before

    os.remove(tmp_path / "out" / "alpha" / "_spark_metadata" / "0")
    fm, root = open_file_manager(ckpt)
    os.makedirs(ckpt)
    assert claim(fm, root, "alpha", "dagster run r1 (alpha)").recorded  # as its first run records it
    result, verdicts = run_checks_only(defs)  # a run refused before Spark wrote anything leaves just that
    assert verdicts["checkpoint_health_check"].passed, verdicts["checkpoint_health_check"].description

    synthetic.write_local(ckpt, batches=3, partitions=1, retain_state=3)  # the query ran: its pass synced the ledger
    code, r = cli_json("ledger", "sync", ckpt)
    assert code == 0, r
    shutil.rmtree(ckpt)  # then the checkpoint went (by hand, a clean-up job)
    os.makedirs(ckpt)
    before = tree_snapshot(str(tmp_path))
    result, verdicts = run_checks_only(defs)
    health = verdicts["checkpoint_health_check"]
    assert not health.passed and "the checkpoint is gone" in health.description
    assert "query alpha ran it" in health.description and "start again from batch 0" in health.description
    assert health.metadata["path"].value.endswith("owner.json") and "backup restore" in health.metadata["fix"].value
    assert not result.success
    assert tree_snapshot(str(tmp_path)) == before


def test_launchpad_run_config(tmp_path):
    """rollback_to_batch / rollback_to_time / dry_run / skip_compat_check, all optional and described, under
    ops.<asset>.config."""
    job = make_defs(tmp_path).resolve_job_def("alpha_job")
    fields = job.run_config_schema.config_type.fields["ops"].config_type.fields["alpha"].config_type \
        .fields["config"].config_type.fields
    assert set(fields) == {"rollback_to_batch", "rollback_to_time", "dry_run", "skip_compat_check"}
    assert all(not f.is_required and f.description for f in fields.values())
    for config in ({"rollback_to_batch": 3}, {"rollback_to_time": "2026-11-21T06:30:00Z", "dry_run": True},
                   {"skip_compat_check": True}, {}):
        assert dg.validate_run_config(job, {"ops": {"alpha": {"config": config}}})
    with pytest.raises(dg.DagsterInvalidConfigError):
        dg.validate_run_config(job, {"ops": {"alpha": {"config": {"rollback_to_batch": "three"}}}})


def test_home_and_backup_url_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("CHECKPOINT_OPS_HOME", str(tmp_path / "h"))
    q = StreamingQuery(name="alpha", build=_build, checkpoint=str(tmp_path / "c"))
    settings = streaming_definitions([q]).resources["streaming_settings"]
    assert settings.home == str(tmp_path / "h")
    assert settings.backup_dest("alpha") == f"{tmp_path}/h/backups/alpha"
    assert settings.requests_dir == f"{tmp_path}/h/reprocess-requests"
    other = streaming_definitions([q], home=str(tmp_path / "x"), backup_url="s3://b/p/").resources["streaming_settings"]
    assert other.backup_dest("alpha") == "s3://b/p/alpha"


def test_factory_refuses_bad_queries(tmp_path):
    with pytest.raises(ValueError, match="unique"):
        make_defs(tmp_path, names=("alpha", "alpha"))
    with pytest.raises(ValueError, match="identifier"):
        StreamingQuery(name="my-stream", build=_build, checkpoint="/c")
    with pytest.raises(ValueError, match=r"not the string '/o' \(write sinks=\['/o'\]\)"):
        StreamingQuery(name="q", build=_build, checkpoint="/c", sinks="/o")


@pytest.mark.parametrize("given", [{"checkpoint": "data/ckpt"}, {"checkpoint": "/c", "sinks": ["/o", "./out"]},
                                   {"checkpoint": "/c", "backup_url": "backups"}])
def test_a_relative_location_is_refused_when_the_query_is_defined(given):
    """A relative checkpoint or sink in Python definitions was resolved against each process's current directory:
    the same job run from two directories made two checkpoints, each processing all of the input (a hostile
    review). A YAML component's relative paths go under the home; here they are refused, naming the fix."""
    what, url = next((k, v if isinstance(v, str) else v[-1]) for k, v in reversed(list(given.items())))
    with pytest.raises(ValueError, match=rf"{what} '{re.escape(url)}' is a relative path") as refused:
        StreamingQuery(name="q", build=_build, **given)
    assert "os.path.join(default_home()" in str(refused.value)
    StreamingQuery(name="q", build=_build, checkpoint="s3://bucket/c", sinks=["file:///o", "/abs/o"])  # as they are


@pytest.mark.parametrize("second", [
    {"checkpoint": "file:///data/c/", "sinks": ["/data/o2"]},  # one checkpoint, written two ways
    {"checkpoint": "/data/c2", "sinks": ["/data/o/"]},  # one file sink
    {"checkpoint": "/data/o", "sinks": []},  # one query's output is the other's checkpoint
], ids=["checkpoint", "sink", "sink-as-checkpoint"])
def test_two_queries_on_one_location_are_refused_when_defined(tmp_path, second):
    first = StreamingQuery(name="first", build=_build, checkpoint="/data/c", sinks=["/data/o"])
    with pytest.raises(ValueError, match="queries first and other share one location"):
        streaming_definitions([first, StreamingQuery(name="other", build=_build, **second)], home=str(tmp_path))
    streaming_definitions([first, StreamingQuery(name="other", build=_build, checkpoint="/data/c2",
                                                 sinks=["/data/o2"])], home=str(tmp_path))


def test_schedules_request_valid_runs(tmp_path):
    defs = make_defs(tmp_path, backup_cron="0 * * * *", compaction_cron="30 2 * * *")
    when = datetime.datetime(2026, 11, 22, 3, 0, tzinfo=datetime.timezone.utc)
    with dg.instance_for_test() as instance:
        for name, job, cron in [("checkpoint_backup_schedule", "checkpoint_backup_job", "0 * * * *"),
                                ("sink_compaction_schedule", "sink_compaction_job", "30 2 * * *")]:
            schedule = defs.resolve_schedule_def(name)
            assert schedule.cron_schedule == cron and schedule.job_name == job
            data = schedule.evaluate_tick(dg.build_schedule_context(instance=instance,
                                                                    scheduled_execution_time=when))
            (request,) = data.run_requests
            assert dg.validate_run_config(defs.resolve_job_def(job), request.run_config)


# ---- the workspace as the dagster CLI sees it -------------------------------------------------------------------


def test_dagster_cli_validates_the_workspace(tmp_path):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path), "CHECKPOINT_OPS_HOME": str(tmp_path / "home"),
           "DAGSTER_DISABLE_TELEMETRY": "1"}
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    p = subprocess.run([os.path.join(os.path.dirname(sys.executable), "dagster"), "definitions", "validate",
                        "-w", "workspace.yaml"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Validation successful for code location streaming" in p.stdout + p.stderr


def test_home_is_checkpoint_ops_home_else_dagster_home_else_the_current_directory(tmp_path, monkeypatch):
    from dagster_checkpoint_ops import default_home

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CHECKPOINT_OPS_HOME", raising=False)
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    assert default_home() == str(tmp_path / ".checkpoint-ops-home")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    assert default_home() == str(tmp_path / "dh" / "checkpoint-ops")
    monkeypatch.setenv("CHECKPOINT_OPS_HOME", "ops")
    assert default_home() == str(tmp_path / "ops")
    assert sorted(os.listdir(tmp_path)) == []  # resolving the home creates nothing


def test_query_settings_are_checked_when_defined():
    with pytest.raises(ValueError, match="not both"):
        StreamingQuery(name="q", build=lambda s: None, checkpoint="/c", schedule="* * * * *",
                       automation_condition=dg.AutomationCondition.eager())
    with pytest.raises(ValueError, match="runs elsewhere"):
        StreamingQuery(name="q", build=None, checkpoint="/c", schedule="* * * * *")
