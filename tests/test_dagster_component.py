"""``StreamingQueryComponent`` through Dagster's component sandbox: ``dg scaffold defs`` output (defs.yaml and a
query stub) loads, validates and materializes on real Spark with the exact expected output; a query from YAML
sits beside one from Python in one code location; a query without ``query:`` is an external asset."""

import os

import dagster as dg
import pytest
from dagster.components.testing import create_defs_folder_sandbox

from dagster_checkpoint_ops import StreamingQuery, StreamingQueryComponent, streaming_definitions
from pipelines.event_counts import event_rows, events_writer, write_event_files


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("CHECKPOINT_OPS_HOME", str(tmp_path / "home"))
    return str(tmp_path / "home")


def rows(spark, path: str) -> list[tuple[str, int]]:
    return sorted((r["key"], r["value"]) for r in spark.read.parquet(path).collect())


def test_scaffolded_component_validates_and_materializes(spark, home):
    with create_defs_folder_sandbox() as sandbox:
        defs_path = sandbox.scaffold_component(component_cls=StreamingQueryComponent, defs_path="my_stream")
        assert (defs_path / "defs.yaml").exists() and (defs_path / "query.py").exists()
        yaml_text = (defs_path / "defs.yaml").read_text()
        assert "type: dagster_checkpoint_ops.component.StreamingQueryComponent" in yaml_text \
            or "type: dagster_checkpoint_ops.StreamingQueryComponent" in yaml_text
        assert 'query: query:build' in yaml_text
        with sandbox.load_component_and_build_defs(defs_path=defs_path) as (component, defs):
            assert isinstance(component, StreamingQueryComponent)
            dg.Definitions.validate_loadable(defs)
            assert defs.resolve_schedule_def("my_stream_schedule").cron_schedule == "*/5 * * * *"
            for name in ("my_stream_checkpoint_backup_job", "my_stream_checkpoint_undo_job",
                         "my_stream_checkpoint_restore_job", "my_stream_job"):
                assert defs.resolve_job_def(name).name == name
            write_event_files(os.path.join(home, "my_stream", "incoming"), 0, 3)
            with dg.instance_for_test() as instance:
                result = defs.resolve_job_def("my_stream_job").execute_in_process(instance=instance)
            assert result.success
            (mat,) = result.asset_materializations_for_node("my_stream")
            md = {k: v.value for k, v in mat.metadata.items()}
            assert md["input_rows"] == 15
            assert {c.check_name: c.passed for c in result.get_asset_check_evaluations()}["checkpoint_health_check"]
    want = sorted((r["key"], r["value"]) for i in range(3) for r in event_rows(i))
    assert rows(spark, os.path.join(home, "my_stream", "output")) == want


def test_yaml_and_python_queries_side_by_side(home, tmp_path):
    incoming, out = str(tmp_path / "in"), str(tmp_path / "py_out")
    python_query = StreamingQuery(name="py_stream", build=lambda spark: events_writer(spark, incoming, out),
                                  checkpoint=str(tmp_path / "py_ckpt"), sinks=[out])
    with create_defs_folder_sandbox() as sandbox:
        defs_path = sandbox.scaffold_component(
            component_cls=StreamingQueryComponent, defs_path="elsewhere",
            defs_yaml_contents={"type": "dagster_checkpoint_ops.StreamingQueryComponent", "attributes": {
                "name": "elsewhere", "checkpoint": str(tmp_path / "ext_ckpt"), "sinks": [str(tmp_path / "ext_out")],
                "backup_url": str(tmp_path / "ext_backups"), "retention": "30d"}})
        with sandbox.load_component_and_build_defs(defs_path=defs_path) as (_, yaml_defs):
            defs = dg.Definitions.merge(streaming_definitions([python_query]), yaml_defs)
            dg.Definitions.validate_loadable(defs)
            specs = {s.key.to_user_string(): s for s in defs.resolve_all_asset_specs()}
            assert set(specs) == {"py_stream", "elsewhere"}
            assert not defs.resolve_assets_def("py_stream").is_external
            assert defs.resolve_assets_def("elsewhere").is_external
            for name in ("elsewhere_rollback_job", "checkpoint_backup_job", "elsewhere_checkpoint_backup_job",
                         "checkpoint_undo_job", "elsewhere_checkpoint_undo_job"):
                assert defs.resolve_job_def(name).name == name
            assert defs.resolve_sensor_def("elsewhere_checkpoint_progress_sensor")
            assert defs.resolve_sensor_def("reprocess_request_sensor")


def test_automation_condition_from_yaml(home, tmp_path):
    with create_defs_folder_sandbox() as sandbox:
        defs_path = sandbox.scaffold_component(
            component_cls=StreamingQueryComponent, defs_path="auto",
            defs_yaml_contents={"type": "dagster_checkpoint_ops.StreamingQueryComponent", "attributes": {
                "name": "auto", "query": "pipelines.definitions:build_events", "checkpoint": "auto/checkpoint",
                "spark_config": {"spark.sql.shuffle.partitions": "2"},
                "automation_condition": "{{ automation_condition.on_cron('*/5 * * * *') }}"}})
        with sandbox.load_component_and_build_defs(defs_path=defs_path) as (component, defs):
            assert {k: str(v) for k, v in component.spark_config.items()} == {"spark.sql.shuffle.partitions": "2"}
            spec = defs.resolve_assets_def("auto").specs_by_key[dg.AssetKey("auto")]
            assert spec.automation_condition.get_label() == "on_cron(*/5 * * * *, UTC)"
            assert not any(s.name == "auto_schedule" for s in defs.schedules or [])
