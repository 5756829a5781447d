"""The compat step of a streaming materialization on real Spark: a new query passes, an unchanged one is
not restarted again (cheap), a change Spark refuses fails the run with its error class before the query
starts (and ``skip_compat_check`` lets it run into Spark's own refusal), a silently different one warns and
runs. The query is built once a materialization, unless Spark's restart judged (and so changed) the writer."""

import os

import dagster as dg
import pytest

from checkpoint_ops.model.checkpoint import Checkpoint
from checkpoint_ops.query_profile import read_profile
from pipelines.event_counts import read_events, windowed_counts, write_bad_event_file, write_event_files
from dagster_checkpoint_ops.streaming import StreamingQuery, streaming_definitions
from tests.helpers import cli_json, tree_snapshot
from tests.spark_runs import FLAVOURS, SESSION_CONF, unload_state_stores

VARIANT = {"key_changed": False, "partitions": None, "scale": 1}
BUILDS: list = []  # one entry per call of the query's build function


def guarded_query(base: str) -> StreamingQuery:
    inp, out = os.path.join(base, "input"), os.path.join(base, "output")

    def build(spark):
        from pyspark.sql import functions as F

        BUILDS.append(dict(VARIANT))
        for key, value in FLAVOURS["hdfs"].items():
            spark.conf.set(key, value)
        partitions = VARIANT["partitions"] or SESSION_CONF["spark.sql.shuffle.partitions"]
        spark.conf.set("spark.sql.shuffle.partitions", partitions)
        events = read_events(spark, inp)
        if VARIANT["key_changed"]:
            events = events.withColumn("key", F.length("key"))
        if VARIANT.get("poison_above"):  # a batch with a larger value fails the query
            events = events.withColumn("value", F.when(F.col("value") > VARIANT["poison_above"], F.raise_error(
                F.lit("poisoned input"))).otherwise(F.col("value")))
        return windowed_counts(events, VARIANT["scale"]).writeStream.format("parquet").option("path", out)

    return StreamingQuery(name="guarded", build=build, checkpoint=os.path.join(base, "checkpoint"), sinks=[out])


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst


def materialize(defs, instance, **config) -> dg.ExecuteInProcessResult:
    run_config = {"ops": {"guarded": {"config": config}}} if config else None
    return defs.resolve_job_def("guarded_job").execute_in_process(instance=instance, run_config=run_config,
                                                                  raise_on_error=False)


def metadata(result) -> dict:
    (mat,) = result.asset_materializations_for_node("guarded")
    return {k: v.value for k, v in mat.metadata.items()}


def failure(result):
    return result.get_step_failure_events()[0].step_failure_data.user_failure_data


def fresh_guarded(tmp_path):
    """The guarded query as first written, its definitions, and its input directory."""
    VARIANT.update(key_changed=False, partitions=None, scale=1)
    base = str(tmp_path / "q")
    query = guarded_query(base)
    defs = streaming_definitions([query], home=str(tmp_path / "home"), spark_config=SESSION_CONF)
    return query, defs, os.path.join(base, "input")


def test_compat_step_before_every_run(spark, tmp_path, instance):
    BUILDS.clear()
    query, defs, inp = fresh_guarded(tmp_path)
    try:
        write_event_files(inp, 0, 3)
        first = materialize(defs, instance)
        assert first.success, first.all_events
        md = metadata(first)
        assert md["compat"] == "compatible" and md["compat_spark_restart"] == "not needed (new checkpoint)"
        assert len(BUILDS) == 1, "the run started the writer the compat step built"

        write_event_files(inp, 3, 4)
        second = materialize(defs, instance)  # nothing changed: Spark is not restarted on a copy again
        assert second.success
        assert metadata(second)["compat_spark_restart"] == "not needed (unchanged)"
        assert len(BUILDS) == 2

        # a change Spark accepts: judged on a copy with the writer (its sink replaced by noop), so the run
        # builds the query again and writes to the real sink
        VARIANT["scale"] = 2
        unload_state_stores(spark)
        write_event_files(inp, 4, 5)
        judged = materialize(defs, instance)
        assert judged.success, judged.all_events
        md = metadata(judged)
        assert md["compat_spark_restart"].startswith("restarted batch"), md["compat_spark_restart"]
        assert len(BUILDS) == 4
        ran, recorded_at = md["last_committed_batch"], md["compat_batch"]
        assert md["batches_run"] >= 1 and os.path.isfile(os.path.join(query.sinks[0], "_spark_metadata", str(ran)))

        VARIANT["key_changed"] = True
        unload_state_stores(spark)
        write_event_files(inp, 5, 6)
        before = tree_snapshot(query.checkpoint, *query.sinks)
        refused = materialize(defs, instance)
        assert not refused.success
        fail = failure(refused)
        assert "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE" in fail.description and "Rule:" in fail.description
        # Spark itself refused it on the copy: skipping the check is no way out (it runs into the same refusal)
        assert "skip_compat_check" not in fail.description and "new checkpoint" in fail.description, fail.description
        assert fail.metadata["compat_error_classes"].value == "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"
        assert tree_snapshot(query.checkpoint, *query.sinks) == before, "the refused query started"

        # with a rollback: judged where the rollback leaves the checkpoint, before it is applied, so a query Spark
        # refuses there leaves the checkpoint as it was (the rollback used to be applied first, and then stood)
        rolled = materialize(defs, instance, rollback_to_batch=ran - 1)
        assert not rolled.success
        fail = failure(rolled)
        assert f"rolled back to batch {ran - 1}" in fail.description, fail.description
        assert "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE" in fail.description and "not applied" in fail.description
        assert tree_snapshot(query.checkpoint, *query.sinks) == before, "the rollback was applied"
        dry = materialize(defs, instance, rollback_to_batch=ran - 1, dry_run=True)  # a dry run says the same
        assert not dry.success and "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE" in failure(dry).description
        assert f"rolled back to batch {ran - 1}" in failure(dry).description
        assert tree_snapshot(query.checkpoint, *query.sinks) == before

        skipped = materialize(defs, instance, skip_compat_check=True)  # the user insists: Spark itself refuses
        assert not skipped.success
        assert "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE" in failure(skipped).description
        unload_state_stores(spark)

        VARIANT.update(key_changed=False, partitions="4")
        warned = materialize(defs, instance)
        assert warned.success, warned.all_events
        md = metadata(warned)
        assert md["compat"] == "silently different (1)"
        (diff,) = md["compat_differences"]
        assert diff["aspect"] == "conf" and diff["now"] == "spark.sql.shuffle.partitions=4"
        # the plan is the one Spark already accepted: the pinned setting is checked without restarting Spark
        assert md["compat_spark_restart"] == "not needed (unchanged)"
        assert len(BUILDS) == 9, "refused, refused with a rollback, and its dry run: built once each; skipped: " \
            "built by the run; warned: built once"
        logs = [e.user_message for e in instance.all_logs(warned.run_id)]
        assert any("silently different after the restart" in m and "shuffle.partitions" in m for m in logs)

        # a rollback to a batch before the accepted query was recorded (where the judged run recorded it): the
        # state there was written by the query before it (scale 1), so the query is judged against that one: the
        # scaled value is to check by hand again, and Spark restarts the copy
        unload_state_stores(spark)
        again = materialize(defs, instance, rollback_to_batch=recorded_at - 1)
        assert again.success, again.all_events
        md = metadata(again)
        assert md["compat_batch"] == recorded_at - 1 and md["compat_spark_restart"].startswith("restarted batch"), md
        verdicts = [(d["aspect"], d["verdict"]) for d in md["compat_differences"]]
        assert verdicts == [("conf", "silently-different"), ("projection", "check-by-hand")], verdicts
    finally:
        VARIANT.update(key_changed=False, partitions=None, scale=1)
        unload_state_stores(spark)


def test_a_rollback_that_leaves_an_undeclared_file_sink_ahead_is_refused_before_it_is_applied(spark, tmp_path,
                                                                                               instance):
    """The asset declares no sink, its query writes a file sink: a rollback would leave the sink's log ahead of the
    checkpoint. The run is refused before the rollback, nothing changed, also with skip_compat_check (both used to
    warn and apply it). A command-line rollback without the sink (a warning there) shows why: Spark's file sink
    skips the batches its log holds without running them, so the stateful query commits them without their state
    (the next run's health check: state-missing; Spark fails to load it, CANNOT_LOAD_STATE_STORE, as fsck's tests
    prove)."""
    query, _, inp = fresh_guarded(tmp_path)
    undeclared = StreamingQuery(name="guarded", build=query.build, checkpoint=query.checkpoint, sinks=[])
    defs = streaming_definitions([undeclared], home=str(tmp_path / "home"), spark_config=SESSION_CONF)
    try:
        for start in range(4):
            write_event_files(inp, start, start + 1)
            assert materialize(defs, instance).success
        last = Checkpoint.open(query.checkpoint).latest_commit
        target = last - 2
        before = tree_snapshot(os.path.dirname(query.checkpoint))  # checkpoint, output and our files beside them
        for config in ({}, {"skip_compat_check": True}):
            refused = materialize(defs, instance, rollback_to_batch=target, **config)
            assert not refused.success
            fail = failure(refused)
            assert fail.description.startswith("rollback refused: asset guarded's query writes the file sink "
                                               f"{query.sinks[0]}"), fail.description
            assert f"batches {target + 1}..{last}" in fail.description and "nothing changed" in fail.description
            assert "declare it in the asset's sinks" in fail.description and ".." not in \
                fail.description.replace(f"{target + 1}..{last}", "")
            assert fail.metadata["sink_log_latest_batch"].value == last
            assert tree_snapshot(os.path.dirname(query.checkpoint)) == before, config

        code, doc = cli_json("rollback", query.checkpoint, "--to-batch", str(target), "--yes")
        assert code == 0 and any("no file sink given" in w for w in doc["plan"]["warnings"]), doc
        unload_state_stores(spark)
        # the next run's compat step sees the sink log ahead of the checkpoint, and refuses before Spark runs
        left_ahead = tree_snapshot(os.path.dirname(query.checkpoint))
        refused = materialize(defs, instance)
        assert not refused.success
        fail = failure(refused)
        assert "CANNOT_LOAD_STATE_STORE" in fail.description and "declare the query's file sink" in \
            fail.description and f"rollback_to_batch: {target}" in fail.description, fail.description
        assert tree_snapshot(os.path.dirname(query.checkpoint)) == left_ahead
        rerun = materialize(defs, instance, skip_compat_check=True)
        assert not rerun.success  # the run's health check: the state of the batches Spark skipped is missing
        assert metadata(rerun)["batch_ids"].startswith(f"{target + 1}..")
        health = [e for e in rerun.get_asset_check_evaluations() if e.check_name == "checkpoint_health_check"]
        assert [e.passed for e in health] == [False] and "state-missing" in str(health[0].metadata), health
    finally:
        unload_state_stores(spark)


def test_a_warned_change_stays_warned_until_a_batch_runs_with_it(spark, tmp_path, instance):
    """A change judged "check by hand" on a run that commits nothing: before, that run recorded the changed
    query as the accepted one, so the next run, the one whose batches really mix old and new results, said
    "compatible". Now the record moves only once a batch commits with the change."""
    _, defs, inp = fresh_guarded(tmp_path)
    try:
        write_event_files(inp, 0, 3)
        assert metadata(materialize(defs, instance))["compat"] == "compatible"
        # no new input: a no-data batch may still run (the watermark moved on), then nothing is left to run
        last = metadata(materialize(defs, instance))["last_committed_batch"]
        unload_state_stores(spark)
        VARIANT["scale"] = 2
        idle = metadata(materialize(defs, instance))
        assert idle["last_committed_batch"] == last and idle["compat"].startswith("check by hand"), idle
        write_event_files(inp, 3, 4)
        unload_state_stores(spark)
        ran = metadata(materialize(defs, instance))
        assert ran["last_committed_batch"] > last and ran["compat"] == idle["compat"], ran  # before: "compatible"
        write_event_files(inp, 4, 5)
        unload_state_stores(spark)
        assert metadata(materialize(defs, instance))["compat"] == "compatible"  # accepted once it ran
    finally:
        VARIANT.update(key_changed=False, partitions=None, scale=1)
        unload_state_stores(spark)


def test_a_run_refused_before_its_query_started_records_no_accepted_query(spark, tmp_path, instance):
    """The checkpoint moved aside (its output still there) and the query changed: the run is refused before the
    query starts. It recorded the changed query as accepted at a new checkpoint with nothing run, so once the
    checkpoint was back the next run said "not needed (unchanged)", skipped Spark's judgment, and the query
    failed inside Spark, leaving an offsets file without its commit (review). Now that run records nothing."""
    query, defs, inp = fresh_guarded(tmp_path)
    aside = str(tmp_path / "aside")
    try:
        write_event_files(inp, 0, 3)
        assert materialize(defs, instance).success
        os.rename(query.checkpoint, aside)
        VARIANT["key_changed"] = True
        unload_state_stores(spark)
        assert not materialize(defs, instance).success  # an output without its checkpoint: nothing ran
        os.rename(aside, query.checkpoint)
        write_event_files(inp, 3, 4)
        before = tree_snapshot(query.checkpoint, *query.sinks)
        refused = materialize(defs, instance)
        assert not refused.success
        fail = failure(refused)
        assert fail.metadata["compat_error_classes"].value == "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE", \
            fail.description
        assert tree_snapshot(query.checkpoint, *query.sinks) == before, "the refused query started"
    finally:
        VARIANT.update(key_changed=False, partitions=None, scale=1)
        unload_state_stores(spark)


def test_a_first_run_that_fails_after_committing_batches_records_its_query(spark, tmp_path, instance):
    """A query at a new checkpoint is recorded once a batch commits: also when the run then fails (review of the
    change above: the failure skipped the record, and the next run had no mode or sink to compare a change with)."""
    query, defs, inp = fresh_guarded(tmp_path)
    try:
        VARIANT["poison_above"] = 1000
        write_event_files(inp, 0, 3)
        write_bad_event_file(inp, 3, factor=1000)  # batch 3 fails
        failed = materialize(defs, instance)
        assert not failed.success
        ckpt = Checkpoint.open(query.checkpoint)
        assert ckpt.latest_commit is not None and ckpt.latest_commit >= 0
        record = read_profile(ckpt.fm, ckpt.root)
        assert record is not None and record.query_id is not None, "the batches that ran recorded no query"
    finally:
        VARIANT.pop("poison_above", None)
        unload_state_stores(spark)


def test_what_a_refused_run_offers_depends_on_whether_a_rollback_covers_the_sink():
    """A refusal a rollback resolves offers rollback_to_batch only when the asset declares the query's file sink
    (the rollback rolls back the declared sinks alone); a refusal no query change causes does not offer skipping
    the check, which would fail the same way in Spark."""
    from types import SimpleNamespace

    from checkpoint_ops.compat import FAILS, Difference
    from checkpoint_ops.query_profile import SinkProfile
    from dagster_checkpoint_ops.compat import _way_out

    report = SimpleNamespace(query=SimpleNamespace(sink=SinkProfile("file", "parquet", "/data/out")))
    ahead = Difference("sink", FAILS, "x", "x", "effect", "rule", fix="roll back", rollback_to=7)
    declared = StreamingQuery("q", None, "/data/ckpt", sinks=("/data/out",))
    undeclared = StreamingQuery("q", None, "/data/ckpt", sinks=())
    assert "rollback_to_batch: 7" in _way_out(declared, report, [ahead])
    offered = _way_out(undeclared, report, [ahead])
    assert "declare the query's file sink (/data/out)" in offered and "rollback_to_batch: 7" in offered
    first_batch = Difference("sink", FAILS, "x", "x", "effect", "rule", fix="start afresh")
    assert _way_out(declared, report, [first_batch]) == ""
    changed_key = Difference("stateful-operators", FAILS, "a", "b", "effect", "rule")
    assert "skip_compat_check" in _way_out(declared, report, [changed_key])
    by_spark = Difference("state-schema", FAILS, "a", "b", "effect", "rule", found_by="spark")
    assert "skip_compat_check" not in _way_out(declared, report, [by_spark])
