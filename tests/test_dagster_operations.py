"""Operations from Dagster on real Spark: checkpoint_undo_job and checkpoint_restore_job through the operation
runner, a query that runs elsewhere (external asset, its rollback job refused while the query holds the lease,
its progress sensor), per-query Spark settings, what on call reads (batch times, the window in times), and
the output of a file sink as of a batch (``sink files --as-of-batch``)."""

import os

import dagster as dg
import pytest

from checkpoint_ops.backup import Repository, list_backups
from checkpoint_ops.operation import RunOptions, run
from checkpoint_ops.rollback import RollbackOperation
from checkpoint_ops.sinklog import files_as_of_batch, open_context
from checkpoint_ops.spark import hold_lease_while_active
from dagster_checkpoint_ops import StreamingQuery, streaming_definitions
from pipelines.event_counts import event_rows, events_writer, read_events, write_event_files
from tests.helpers import cli, cli_json, content_snapshot, tree_snapshot
from tests.spark_runs import SESSION_CONF

QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


@pytest.fixture(scope="module")
def instance():
    with dg.instance_for_test() as inst:
        yield inst


def events_query(base, name="events", **kw) -> StreamingQuery:
    incoming, out = os.path.join(base, "in"), os.path.join(base, "out")
    return StreamingQuery(name=name, build=lambda spark: events_writer(spark, incoming, out),
                          checkpoint=os.path.join(base, "ckpt"), sinks=[out], **kw)


def execute(defs, job, instance, config=None):
    run_config = {**QUIET, **(config or {})}
    return defs.resolve_job_def(job).execute_in_process(instance=instance, run_config=run_config,
                                                        raise_on_error=False)


def materialized(result, name) -> dict:
    (mat,) = result.asset_materializations_for_node(name)
    return {k: v.value for k, v in mat.metadata.items()}


def observed(result) -> list[dict]:
    return [{k: v.value for k, v in e.asset_observation_data.asset_observation.metadata.items()}
            for e in result.all_events if e.event_type == dg.DagsterEventType.ASSET_OBSERVATION]


def failure_of(result) -> str:
    """The reason the run failed, as the UI shows it (a dg.Failure's description)."""
    data = result.get_step_failure_events()[0].step_failure_data
    return data.user_failure_data.description if data.user_failure_data else data.error.message


def rows(spark, path) -> list:
    return sorted((r["key"], r["value"]) for r in spark.read.parquet(path).collect())


def expected(indexes) -> list:
    return sorted((r["key"], r["value"]) for i in indexes for r in event_rows(i))


def run_twice(query, defs, instance):
    """Files 0..1 then 2..3, one file per batch: batches 0..3."""
    inp = os.path.join(os.path.dirname(query.checkpoint), "in")
    write_event_files(inp, 0, 2)
    first = execute(defs, f"{query.name}_job", instance)
    write_event_files(inp, 2, 4)
    second = execute(defs, f"{query.name}_job", instance)
    assert first.success and second.success
    return materialized(first, query.name), materialized(second, query.name)


def test_undo_job_reverts_a_rollback_then_spark_resumes(spark, tmp_path, instance):
    query = events_query(str(tmp_path / "q"))
    defs = streaming_definitions([query], home=str(tmp_path / "home"), spark_config=SESSION_CONF)
    run_twice(query, defs, instance)
    before = content_snapshot(query.checkpoint, *query.sinks)
    rolled = run(RollbackOperation(query.checkpoint, 0, None, list(query.sinks)), RunOptions(yes=True))
    rolled_back = rolled.outcome.op_id
    assert content_snapshot(query.checkpoint, *query.sinks) != before

    dry = execute(defs, "checkpoint_undo_job", instance, {"ops": {"checkpoint_undo": {"config": {
        "query": query.name, "dry_run": True}}}})
    assert dry.success
    (md,) = observed(dry)
    assert md["dry_run"] and len(md["plan_hash"]) == 64 and "op_id" not in md
    assert md["undone_op_id"] == rolled_back  # what it would revert, by the id the rollback has
    undone = execute(defs, "checkpoint_undo_job", instance, {"ops": {"checkpoint_undo": {"config": {
        "query": query.name}}}})
    assert undone.success, failure_of(undone)
    (md,) = observed(undone)
    assert md["undone_op_id"] == rolled_back and "op_id" not in md and not md["dry_run"]
    assert content_snapshot(query.checkpoint, *query.sinks) == before  # byte for byte, as before the rollback

    again = execute(defs, "checkpoint_undo_job", instance, {"ops": {"checkpoint_undo": {"config": {
        "query": query.name}}}})
    assert not again.success and "undo refused" in failure_of(again)
    assert content_snapshot(query.checkpoint, *query.sinks) == before
    resumed = execute(defs, f"{query.name}_job", instance)
    assert resumed.success, failure_of(resumed)
    resumed_md = materialized(resumed, query.name)
    assert resumed_md["input_rows"] == 0 and resumed_md["batch_details"] == []  # nothing to redo
    assert rows(spark, query.sinks[0]) == expected(range(4))

    unknown = execute(defs, "checkpoint_undo_job", instance, {"ops": {"checkpoint_undo": {"config": {
        "query": "nope"}}}})
    assert not unknown.success and "'nope' is not one of" in failure_of(unknown)


def test_restore_job_into_an_empty_target_then_spark_resumes_there(spark, tmp_path, instance):
    query = events_query(str(tmp_path / "q"))
    defs = streaming_definitions([query], home=str(tmp_path / "home"), spark_config=SESSION_CONF)
    run_twice(query, defs, instance)
    assert execute(defs, "checkpoint_backup_job", instance).success
    dest = defs.resources["streaming_settings"].backup_dest(query.name)
    (backup,) = list_backups(Repository.open(dest))
    target, sink_target = str(tmp_path / "restored" / "ckpt"), str(tmp_path / "restored" / "out")
    config = {"query": query.name, "backup_id": backup.id, "target": target, "sink_targets": [sink_target]}

    dry = execute(defs, "checkpoint_restore_job", instance, {"ops": {"checkpoint_restore": {"config": {
        **config, "dry_run": True}}}})
    assert dry.success and not os.path.exists(os.path.join(target, "offsets"))  # a dry run restores nothing
    none = execute(defs, "checkpoint_restore_job", instance, {"ops": {"checkpoint_restore": {"config": {
        **config, "sink_targets": []}}}})  # the job's key is named, not the command line's flag (a hostile review)
    assert not none.success and "(sink_targets; got 0)" in failure_of(none), failure_of(none)
    assert "--sink-target" not in failure_of(none)
    done = execute(defs, "checkpoint_restore_job", instance, {"ops": {"checkpoint_restore": {"config": config}}})
    assert done.success, failure_of(done)
    (md,) = observed(done)
    assert md["op_id"] and md["backup_id"] == backup.id and md["restored_to"] == target

    snapshot = tree_snapshot(target, sink_target)
    refused = execute(defs, "checkpoint_restore_job", instance, {"ops": {"checkpoint_restore": {"config": config}}})
    assert not refused.success and "restore refused" in failure_of(refused)
    assert tree_snapshot(target, sink_target) == snapshot  # a non-empty target is never touched

    inp = os.path.join(os.path.dirname(query.checkpoint), "in")
    copy = StreamingQuery(name="copy", build=lambda s: events_writer(s, inp, sink_target), checkpoint=target,
                          sinks=[sink_target])
    write_event_files(inp, 4, 5)
    resumed = execute(streaming_definitions([copy], home=str(tmp_path / "home2"), spark_config=SESSION_CONF),
                      "copy_job", instance)
    assert resumed.success and materialized(resumed, "copy")["batch_ids"] == "4..4"
    assert rows(spark, sink_target) == expected(range(5))


def test_external_query_rollback_refused_while_it_runs_then_progress_observed(spark, tmp_path, instance):
    base = str(tmp_path / "ext")
    incoming, out, ckpt = os.path.join(base, "in"), os.path.join(base, "out"), os.path.join(base, "ckpt")
    query = StreamingQuery(name="elsewhere", build=None, checkpoint=ckpt, sinks=[out])
    defs = streaming_definitions([query], home=str(tmp_path / "home"), spark_config=SESSION_CONF)
    assert defs.resolve_assets_def("elsewhere").is_external
    write_event_files(incoming, 0, 2)
    started = read_events(spark, incoming).writeStream.format("parquet").option("path", out).option(
        "checkpointLocation", ckpt).trigger(processingTime="1 second").start()
    with hold_lease_while_active(started, ckpt, [out]):
        started.processAllAvailable()
        write_event_files(incoming, 2, 4)
        started.processAllAvailable()
        before = content_snapshot(ckpt, out)
        refused = execute(defs, "elsewhere_rollback_job", instance, {"ops": {"rollback_elsewhere": {"config": {
            "rollback_to_batch": 0}}}})
        assert not refused.success
        message = failure_of(refused)
        assert "rollback refused" in message and "hold_lease_while_active" in message, message
        assert content_snapshot(ckpt, out) == before
        started.stop()
    write_event_files(incoming, 4, 6)  # arrive after the query stopped: unprocessed

    sensor = defs.resolve_sensor_def("checkpoint_progress_sensor")
    files = defs.resources["checkpoint_files"]
    tick = sensor(dg.build_sensor_context(instance=instance, resources={"checkpoint_files": files}))
    (obs,) = tick.asset_events
    md = {k: v.value for k, v in obs.metadata.items()}
    last = md["last_committed_batch"]
    assert last >= 1 and md["unprocessed_files"] == 2 and md["last_batch_time"].endswith("Z")
    details = md["batch_details"]
    assert [d["batch"] for d in details] == list(range(last + 1))
    assert sum(d["input_files"] for d in details) == 4 and all(d["time"] for d in details)
    again = sensor(dg.build_sensor_context(instance=instance, cursor=tick.cursor,
                                           resources={"checkpoint_files": files}))
    assert not again.asset_events  # nothing new since the cursor

    rolled = execute(defs, "elsewhere_rollback_job", instance, {"ops": {"rollback_elsewhere": {"config": {
        "rollback_to_batch": 0}}}})
    assert rolled.success, failure_of(rolled)
    (md,) = observed(rolled)
    assert md["rollback_target_batch"] == 0 and md["rollback_op_id"]
    restarted = read_events(spark, incoming).writeStream.format("parquet").option("path", out).option(
        "checkpointLocation", ckpt).trigger(availableNow=True).start()
    restarted.awaitTermination()
    assert rows(spark, out) == expected(range(6))  # batch 0's rows once, everything after reprocessed once
    # the sensor reports the batches the rollback made Spark run again (it reported only those above its
    # cursor's batch before: batches 1..last ran again unseen)
    rerun = sensor(dg.build_sensor_context(instance=instance, cursor=tick.cursor,
                                           resources={"checkpoint_files": files}))
    (obs,) = rerun.asset_events
    md = {k: v.value for k, v in obs.metadata.items()}
    assert [d["batch"] for d in md["batch_details"]] == list(range(1, md["last_committed_batch"] + 1)), md
    assert md["rerun_after_rollback_from_batch"] == last, md
    assert sum(d["input_files"] for d in md["batch_details"]) == 5, md  # every file after batch 0's, once
    quiet = sensor(dg.build_sensor_context(instance=instance, cursor=rerun.cursor,
                                           resources={"checkpoint_files": files}))
    assert not quiet.asset_events


def test_spark_config_per_query_and_on_call_metadata(spark, tmp_path, instance):
    seen = []

    def build(session):
        seen.append(session.conf.get("spark.sql.shuffle.partitions"))
        return events_writer(session, str(tmp_path / "q" / "in"), str(tmp_path / "q" / "out"))

    query = StreamingQuery(name="tuned", build=build, checkpoint=str(tmp_path / "q" / "ckpt"),
                           sinks=[str(tmp_path / "q" / "out")], spark_config={"spark.sql.shuffle.partitions": "7"})
    defs = streaming_definitions([query], home=str(tmp_path / "home"), spark_config=SESSION_CONF)
    shared = spark.conf.get("spark.sql.shuffle.partitions")
    write_event_files(str(tmp_path / "q" / "in"), 0, 2)
    first = execute(defs, "tuned_job", instance)
    write_event_files(str(tmp_path / "q" / "in"), 2, 3)
    second = execute(defs, "tuned_job", instance)
    assert first.success and second.success
    # every build (the compat check's and the run's) saw the query's setting; the session keeps the shared one
    assert len(seen) >= 2 and set(seen) == {"7"} and spark.conf.get("spark.sql.shuffle.partitions") == shared
    warnings = [e.user_message for e in instance.all_logs(first.run_id) if "default_limit: 1" in e.user_message]
    assert warnings and "checkpoint-tuned" in warnings[0]  # this test instance sets no pool limit

    md = materialized(second, "tuned")
    (batch,) = md["batch_details"]  # one file per batch: files 0 and 1 were batches 0 and 1
    assert batch["batch"] == 2 and batch["input_rows"] == 5 and batch["time"].endswith("Z")
    assert "| 2 |" in md["batches"]
    window = md["rollback_window_detail"]
    assert (window["earliest_batch"], window["latest_batch"]) == (0, 2)
    assert window["latest_time"] == batch["time"] and window["earliest_time"] < window["latest_time"]
    # the window's first time, as rollback_to_time, keeps batch 0 only
    dry = execute(defs, "tuned_job", instance, {"ops": {"tuned": {"config": {
        "rollback_to_time": window["earliest_time"], "dry_run": True}}}})
    # a dry run is observed, not materialized (nothing ran)
    assert dry.success and not dry.asset_materializations_for_node("tuned")
    assert [md["rollback_target_batch"] for md in observed(dry)] == [0]


def test_sink_files_as_of_batch_reads_the_output_as_it_was(spark, tmp_path, instance):
    """Twelve batches of one file each (Spark compacts its sink log at batches 4 and 9), then the compaction
    job, which removes the log files before 4.compact: the early batches come from the ledger the asset keeps."""
    query = events_query(str(tmp_path / "q"))
    defs = streaming_definitions([query], home=str(tmp_path / "home"), spark_config=SESSION_CONF)
    write_event_files(os.path.join(str(tmp_path / "q"), "in"), 0, 12)
    assert execute(defs, "events_job", instance).success
    assert execute(defs, "sink_compaction_job", instance).success
    log_dir = os.path.join(query.sinks[0], "_spark_metadata")
    assert "1" not in os.listdir(log_dir), "the early log files are still there: the ledger path is not exercised"
    ctx = open_context(query.sinks[0], query.checkpoint)
    for batch in (1, 4, 6, 11):
        snap = files_as_of_batch(ctx, batch)
        got = sorted((r["key"], r["value"]) for r in spark.read.parquet(*snap.paths).collect())
        assert got == expected(range(batch + 1)), batch
    assert files_as_of_batch(ctx, 1).source == "spark log and batch ledger"
    code, doc = cli_json("sink", "files", query.sinks[0], "--checkpoint", query.checkpoint, "--as-of-batch", "4")
    assert code == 0 and doc["paths"] == list(files_as_of_batch(ctx, 4).paths)
    before = tree_snapshot(query.checkpoint, *query.sinks)
    code, _, err = cli("sink", "files", query.sinks[0], "--as-of-batch", "12")
    assert code == 2 and "ends at batch 11" in err and query.sinks[0] in err
    code, _, err = cli("sink", "files", query.sinks[0], "--as-of-batch", "1", "--batch", "1")
    assert code == 2 and "exactly one of --batch N" in err
    assert tree_snapshot(query.checkpoint, *query.sinks) == before


def test_pool_limit_warning_names_the_stanza_only_when_the_instance_sets_no_limit():
    from dagster_checkpoint_ops.pools import pool_limit_warning

    with dg.instance_for_test() as unlimited:
        note = pool_limit_warning(unlimited, "events")
        assert "checkpoint-events" in note and "concurrency:\n  pools:\n    default_limit: 1" in note
    with dg.instance_for_test(overrides={"concurrency": {"pools": {"default_limit": 1}}}) as limited:
        assert pool_limit_warning(limited, "events") is None
