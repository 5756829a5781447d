"""The Dagster code location loads, and the main job runs a real streaming query end to end."""

from __future__ import annotations

import dagster as dg
from dagster_pyspark import PySparkResource

from pipelines.definitions import LOCAL_SPARK, defs
from pipelines.event_counts import expected_windows, flush_files, read_output, write_event_files
from resources.checkpoint_files import CheckpointFileManagerResource
from resources.streams import StreamLocations


def test_definitions_load():
    dg.Definitions.validate_loadable(defs)
    job = defs.resolve_job_def("event_counts_job")
    assert job.name.endswith("_job")


def test_event_counts_job_runs_and_checks_pass(spark, tmp_path):
    loc = StreamLocations(input_dir=str(tmp_path / "in"), checkpoint_dir=str(tmp_path / "ckpt"),
                          output_dir=str(tmp_path / "out"))
    resources = {"pyspark": PySparkResource(spark_config=LOCAL_SPARK), "locations": loc,
                 "checkpoint_files": CheckpointFileManagerResource()}
    job = defs.resolve_job_def("event_counts_job")
    write_event_files(loc.input_dir, 0, 6)
    flush_files(loc.input_dir, 5)
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(instance=instance, resources=resources)
    assert result.success
    md = result.asset_materializations_for_node("event_counts")[0].metadata
    assert md["input_rows"].value == 6 * 5 + 2
    assert md["last_committed_batch"].value >= 7
    (check,) = result.get_asset_check_evaluations()
    assert check.passed and check.metadata["errors"].value == 0
    assert read_output(spark, loc.output_dir) == {k: [v] for k, v in expected_windows(range(6)).items()}
