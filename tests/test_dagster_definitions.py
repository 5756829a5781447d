"""The factory's definitions without Spark: what they contain, the launchpad config, the schedules, the
reprocessing sensor, and the workspace as the dagster CLI loads it."""

import datetime
import json
import os
import subprocess
import sys

import dagster as dg
import pytest

from pipelines.query import StreamingQuery
from pipelines.streaming import streaming_definitions

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
    assert pools["alpha_checkpoint_health_check"] == "checkpoint-alpha"
    assert pools["beta"] == pools["backup_beta"] == "checkpoint-beta"
    assert "compact_beta" not in pools  # beta has no file sink


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


# ---- reprocess_request_sensor ----------------------------------------------------------------------------------


def sensor_tick(defs, instance, cursor=None):
    sensor = defs.resolve_sensor_def("reprocess_request_sensor")
    ctx = dg.build_sensor_context(instance=instance, cursor=cursor,
                                  resources={"streaming_settings": defs.resources["streaming_settings"]})
    return sensor.evaluate_tick(ctx)


def drop(home, name, doc) -> str:
    folder = os.path.join(home, "reprocess-requests")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "w") as f:
        f.write(doc if isinstance(doc, str) else json.dumps(doc))
    return os.path.join(folder, name)


def test_sensor_turns_a_request_into_one_run(tmp_path):
    home = str(tmp_path)
    defs = make_defs(home)
    with dg.instance_for_test() as instance:
        assert "no request folder" in sensor_tick(defs, instance).skip_message
        path = drop(home, "fix-bad-batch.json", {"asset": "alpha", "to_batch": 7, "id": "INC-1234"})
        drop(home, "by-time.json", {"asset": "beta", "to_time": "2026-11-21T06:30:00Z"})
        tick = sensor_tick(defs, instance)
        by_key = {r.run_key: r for r in tick.run_requests}
        assert set(by_key) == {"INC-1234", "by-time"}  # run_key: the id, else the file name
        r = by_key["INC-1234"]
        assert r.job_name == "alpha_job" and r.run_config == {"ops": {"alpha": {"config": {"rollback_to_batch": 7}}}}
        assert dg.validate_run_config(defs.resolve_job_def("alpha_job"), r.run_config)
        assert by_key["by-time"].run_config["ops"]["beta"]["config"] == {"rollback_to_time": "2026-11-21T06:30:00Z"}
        assert os.path.exists(path)  # marked only once its run exists

        # evaluated again before the run exists: nothing new is asked for
        again = sensor_tick(defs, instance, cursor=tick.cursor)
        assert again.run_requests == [] and "waiting for its run" in again.skip_message

        # the run exists (as the daemon creates it, with its run key): the request is marked handled
        run = instance.create_run_for_job(defs.resolve_job_def("alpha_job"), run_config=r.run_config,
                                          tags={**r.tags, "dagster/run_key": "INC-1234"})
        third = sensor_tick(defs, instance, cursor=again.cursor)
        assert third.run_requests == []
        handled = os.path.join(home, "reprocess-requests", "handled", "fix-bad-batch.json")
        assert os.path.exists(handled) and not os.path.exists(path)
        assert run.run_id in open(handled + ".reason.txt").read()

        # the same id again: it never runs twice, and the file is kept, marked
        dup = drop(home, "again.json", {"asset": "alpha", "to_batch": 3, "id": "INC-1234"})
        fourth = sensor_tick(defs, instance, cursor=third.cursor)
        assert fourth.run_requests == [] and not os.path.exists(dup)
        assert os.path.exists(os.path.join(home, "reprocess-requests", "handled", "again.json"))


@pytest.mark.parametrize("doc, reason", [
    ("{not json", "not valid JSON"),
    ('["alpha", 3]', "not a JSON object"),
    ({"asset": "gamma", "to_batch": 3}, "unknown asset 'gamma'"),
    ({"asset": "alpha"}, "exactly one"),
    ({"asset": "alpha", "to_batch": 3, "to_time": "2026-11-21T06:30:00Z"}, "exactly one"),
    ({"asset": "alpha", "to_batch": -1}, "non-negative"),
    ({"asset": "alpha", "to_batch": True}, "non-negative"),
    ({"asset": "alpha", "to_time": "last tuesday"}, "not an ISO 8601 time"),
    ({"asset": "alpha", "to_batch": 3, "id": ""}, '"id" must be'),
    ({"asset": "alpha", "to_batch": 3, "batch": 4}, "unknown field"),
], ids=["json", "array", "asset", "no-target", "two-targets", "negative", "bool", "time", "id", "field"])
def test_sensor_rejects_bad_requests_with_a_reason(tmp_path, doc, reason):
    home = str(tmp_path)
    defs = make_defs(home)
    path = drop(home, "req.json", doc)
    with dg.instance_for_test() as instance:
        tick = sensor_tick(defs, instance)
    assert tick.run_requests == []
    assert path in tick.skip_message and reason in tick.skip_message, tick.skip_message
    rejected = os.path.join(home, "reprocess-requests", "rejected", "req.json")
    assert os.path.exists(rejected) and not os.path.exists(path)
    assert reason in open(rejected + ".reason.txt").read()


# ---- the workspace as the dagster CLI sees it -------------------------------------------------------------------


def test_dagster_cli_validates_the_workspace(tmp_path):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path), "CHECKPOINT_OPS_HOME": str(tmp_path / "home"),
           "DAGSTER_DISABLE_TELEMETRY": "1"}
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    p = subprocess.run([os.path.join(os.path.dirname(sys.executable), "dagster"), "definitions", "validate",
                        "-w", "workspace.yaml"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Validation successful for code location streaming" in p.stdout + p.stderr
