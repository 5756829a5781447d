"""The asset's declared sinks (``sinks=`` / YAML ``sinks:``) against the query's real sink: a typo is refused
before the query starts; a refusal after the run says what already happened, as a Failure, not a traceback."""

import os

import pytest

from pipelines.event_counts import counts_writer, write_event_files
from dagster_checkpoint_ops.streaming import StreamingQuery, streaming_definitions
from tests.dagster_queries import totals_query
from tests.spark_runs import FLAVOURS, SESSION_CONF
from tests.test_dagster_streaming import instance, materialize  # noqa: F401 (instance: the module's fixture)


def failure_description(result) -> str:
    (failure,) = result.get_step_failure_events()
    data = failure.step_failure_data
    assert data.user_failure_data is not None, f"not a dg.Failure: {data.error.to_string()[:3000]}"
    return data.user_failure_data.description


def listing(*roots: str) -> dict:
    return {root: sorted(os.listdir(root)) if os.path.isdir(root) else None for root in roots}


@pytest.mark.parametrize("skip_compat_check", [False, True])
def test_a_sink_path_typo_is_refused_before_the_query_starts(spark, tmp_path, instance, skip_compat_check):
    """The writer writes ``output``, the asset declares ``outputt``: the run fails before Spark starts (with the
    compat check, which read the writer, and without it), naming the asset, both paths and the field to fix;
    no batch is committed, no directory is made. With the sink corrected the same input runs."""
    base = str(tmp_path / "q")
    inp, out, typo = (os.path.join(base, d) for d in ("input", "output", "outputt"))
    ckpt = os.path.join(base, "checkpoint")

    def build(spark):
        for k, v in FLAVOURS["hdfs"].items():
            spark.conf.set(k, v)
        return counts_writer(spark, inp, out)

    name = f"typo_{int(skip_compat_check)}"
    config = {"skip_compat_check": True} if skip_compat_check else {}
    defs = streaming_definitions([StreamingQuery(name=name, build=build, checkpoint=ckpt, sinks=[typo])],
                                 home=str(tmp_path / "home"), spark_config=SESSION_CONF)
    write_event_files(inp, 0, 2)
    result = materialize(defs, name, instance, **config)
    assert not result.success
    description = failure_description(result)
    assert description.startswith(f"asset {name}: its query writes its file sink to {out}"), description
    assert str([typo]) in description and "sinks=" in description and "YAML sinks:" in description, description
    assert "nothing ran, nothing changed" in description and f"[{out!r}]" in description, description
    assert listing(ckpt, out, typo) == {ckpt: None, out: None, typo: None}

    fixed = streaming_definitions([StreamingQuery(name=name, build=build, checkpoint=ckpt, sinks=[out])],
                                  home=str(tmp_path / "home"), spark_config=SESSION_CONF)
    assert materialize(fixed, name, instance, **config).success
    assert "_spark_metadata" in os.listdir(out)


def test_a_refusal_after_the_run_is_a_failure_saying_what_ran(spark, tmp_path, instance):
    """A foreachBatch query (its sink's path unknown before it runs) with a declared sink it never writes: the
    batches commit, then the check of the declared sinks refuses. The step fails with a dg.Failure naming the
    asset, the declared sinks, the field and the committed batches, not with the library's traceback."""
    base = str(tmp_path / "q")
    query = totals_query(base, name="totals_bad_sink")
    wrong = os.path.join(base, "no-such-output")
    query = StreamingQuery(name=query.name, build=query.build, checkpoint=query.checkpoint, sinks=[wrong])
    defs = streaming_definitions([query], home=str(tmp_path / "home"), spark_config=SESSION_CONF)
    write_event_files(os.path.join(base, "input"), 0, 2)
    result = materialize(defs, query.name, instance)
    assert not result.success
    description = failure_description(result)
    assert description.startswith("asset totals_bad_sink: the query ran and committed batches 0..1"), description
    assert str([wrong]) in description and "sinks=" in description and "YAML sinks:" in description, description
    assert "no such sink output directory" in description and "correct them and run again" in description
    assert sorted(f for f in os.listdir(os.path.join(query.checkpoint, "commits")) if not f.startswith(".")) == ["0", "1"]


def test_a_sink_another_query_writes_or_wrote_is_refused_before_the_query_starts(spark, tmp_path, instance):
    """Asset ``a`` ran and its ledger sync recorded ``output`` as its checkpoint's. Asset ``b``, with a checkpoint
    of its own, declaring (and writing) the same output: before, Spark's file sink skipped every batch id ``a``
    had logged there, ``b`` committed batches whose rows went nowhere, and its checkpoint held no state for them.
    Now ``b`` is refused before its query starts; so is ``a`` once its checkpoint was deleted (a new query would
    skip them the same way). Nothing changes in either case."""
    base = str(tmp_path / "q")
    inp, out = os.path.join(base, "input"), os.path.join(base, "output")
    ckpt_a, ckpt_b = os.path.join(base, "checkpoint_a"), os.path.join(base, "checkpoint_b")

    def build(spark):
        for k, v in FLAVOURS["hdfs"].items():
            spark.conf.set(k, v)
        return counts_writer(spark, inp, out)

    def defs_of(name, ckpt):
        return streaming_definitions([StreamingQuery(name=name, build=build, checkpoint=ckpt, sinks=[out])],
                                     home=str(tmp_path / "home"), spark_config=SESSION_CONF)

    write_event_files(inp, 0, 2)
    assert materialize(defs_of("share_a", ckpt_a), "share_a", instance).success
    before = listing(out, os.path.join(out, "_spark_metadata"))
    for config in ({}, {"skip_compat_check": True}):
        result = materialize(defs_of("share_b", ckpt_b), "share_b", instance, **config)
        assert not result.success
        description = failure_description(result)
        assert description.startswith(f"asset share_b: its sinks"), description
        assert f"records it as the output of checkpoint {ckpt_a}" in description, description
        assert "nothing ran, nothing changed" in description, description
        assert not os.path.exists(ckpt_b) and listing(out, os.path.join(out, "_spark_metadata")) == before

    os.rename(ckpt_a, ckpt_a + ".deleted")
    result = materialize(defs_of("share_a", ckpt_a), "share_a", instance)
    assert not result.success
    description = failure_description(result)
    assert "which now holds no query (it was deleted)" in description, description
    assert "new, empty output directory" in description, description
    assert not os.path.exists(ckpt_a) and listing(out, os.path.join(out, "_spark_metadata")) == before


def test_a_query_function_that_raises_is_reported_with_its_own_traceback(spark, tmp_path, instance):
    """``build(spark)`` raising is the user's code failing before anything ran: said so, with its traceback (before:
    "compat check ... could not judge the checkpoint", and the traceback dropped)."""
    base = str(tmp_path / "q")
    ckpt, out = os.path.join(base, "checkpoint"), os.path.join(base, "output")

    def build(spark):
        raise ValueError("no such table: events_v2")

    defs = streaming_definitions([StreamingQuery(name="raises", build=build, checkpoint=ckpt, sinks=[out])],
                                 home=str(tmp_path / "home"), spark_config=SESSION_CONF)
    result = materialize(defs, "raises", instance)
    assert not result.success
    description = failure_description(result)
    assert description.startswith("raises: build(spark) failed before the query started (nothing ran, nothing "
                                  "changed)"), description
    assert "ValueError: no such table: events_v2" in description and ", in build" in description, description
    assert listing(ckpt, out) == {ckpt: None, out: None}
    # nor is the checkpoint claimed for this asset: it is claimed as its query is about to start
    assert not os.path.exists(os.path.join(base, ".checkpoint-ops", "checkpoint", "owner.json"))


def test_a_checkpoint_another_asset_runs_is_refused_before_anything_runs(spark, tmp_path, instance):
    """Two definitions (two components, two code locations) run one checkpoint, each with its own sink. Before,
    the second ran with at most a "sink moved" warning, resumed where the first stopped, and sent its batches to
    its own output; the first's output missed them for good, and the two took turns from then on. Now the first
    run records its asset beside the checkpoint, and the other asset is refused before anything runs (with the
    compat check, without it, and in a dry run), naming the asset and the record; nothing changes. Deleting the
    record, as the refusal says to for a renamed asset, lets the renamed asset run."""
    base = str(tmp_path / "q")
    inp, ckpt = os.path.join(base, "input"), os.path.join(base, "checkpoint")
    out_a, out_b = os.path.join(base, "output_a"), os.path.join(base, "output_b")

    def defs_of(name, out):
        def build(spark):
            for k, v in FLAVOURS["hdfs"].items():
                spark.conf.set(k, v)
            return counts_writer(spark, inp, out)

        return streaming_definitions([StreamingQuery(name=name, build=build, checkpoint=ckpt, sinks=[out])],
                                     home=str(tmp_path / "home"), spark_config=SESSION_CONF)

    write_event_files(inp, 0, 2)
    assert materialize(defs_of("owner_a", out_a), "owner_a", instance).success
    write_event_files(inp, 2, 1)
    before = listing(ckpt, os.path.join(ckpt, "offsets"), os.path.join(ckpt, "commits"), out_a, out_b)
    record = os.path.join(base, ".checkpoint-ops", "checkpoint", "owner.json")
    for config in ({}, {"skip_compat_check": True}, {"dry_run": True, "rollback_to_batch": 0}):
        result = materialize(defs_of("owner_b", out_b), "owner_b", instance, **config)
        assert not result.success
        description = failure_description(result)
        assert description.startswith(f"asset owner_b: its checkpoint {ckpt} is run by asset owner_a"), description
        assert "nothing ran, nothing changed" in description and f"delete {record}" in description, description
        assert listing(ckpt, os.path.join(ckpt, "offsets"), os.path.join(ckpt, "commits"), out_a, out_b) == before
    # the second definition's jobs that change the checkpoint without running the query are its owner's to run (a
    # hostile review: a copied component's undo job planned an undo of the first one's checkpoint)
    quiet = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}
    elsewhere = streaming_definitions([StreamingQuery(name="owner_b", build=None, checkpoint=ckpt, sinks=[out_b])],
                                      home=str(tmp_path / "home"), spark_config=SESSION_CONF)  # a query run elsewhere
    for defs, job, config in (
            (defs_of("owner_b", out_b), "checkpoint_undo_job", {"ops": {"checkpoint_undo": {"config": {
                "query": "owner_b"}}}}),
            (defs_of("owner_b", out_b), "sink_compaction_job", {}),
            (elsewhere, "owner_b_rollback_job", {"ops": {"rollback_owner_b": {"config": {"rollback_to_batch": 0}}}})):
        result = defs.resolve_job_def(job).execute_in_process(
            instance=instance, run_config={**quiet, **config}, raise_on_error=False)
        assert not result.success
        description = failure_description(result)
        assert f"its checkpoint {ckpt} is run by asset owner_a" in description, description
        assert "Refused: nothing changed" in description and "use asset owner_a's" in description, description
        assert listing(ckpt, os.path.join(ckpt, "offsets"), os.path.join(ckpt, "commits"), out_a, out_b) == before

    assert materialize(defs_of("owner_a", out_a), "owner_a", instance).success  # the owner runs on
    os.remove(record)  # asset owner_a was renamed owner_b: the fix the refusal gives
    write_event_files(inp, 3, 1)
    assert materialize(defs_of("owner_b", out_a), "owner_b", instance).success
    assert sorted(f for f in os.listdir(os.path.join(ckpt, "commits")) if not f.startswith(".")) == ["0", "1", "2"]
    assert not os.path.exists(out_b)
