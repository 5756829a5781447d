"""Run inside the fresh venv, from this project's directory: materialize both queries, roll `clicks` back from
launchpad-style run config, ask for a reprocessing through the request sensor, and let Spark read every output.
Prints one JSON line with what it saw; tests/test_package_install.py judges it."""

import json
import os
import sys
import time

import dagster as dg


def write_files(directory: str, start: int, stop: int) -> None:
    os.makedirs(directory, exist_ok=True)
    for index in range(start, stop):
        tmp = os.path.join(directory, f".f{index}.tmp")
        with open(tmp, "w") as f:
            for j in range(5):
                f.write(json.dumps({"key": f"k{j}", "value": index * 10 + j}) + "\n")
        os.utime(tmp, (1_700_000_000 + index, 1_700_000_000 + index))
        os.rename(tmp, os.path.join(directory, f"events-{index:03d}.json"))


def expected(stop: int) -> list:
    return sorted([f"k{j}", i * 10 + j] for i in range(stop) for j in range(5))


def main() -> int:
    from pipelines.definitions import defs
    from pipelines.queries import clicks_paths
    import dagster_checkpoint_ops

    home = dagster_checkpoint_ops.default_home()
    out: dict = {"package_file": dagster_checkpoint_ops.__file__,
                 "pipelines_file": sys.modules["pipelines"].__file__,
                 "resources_file": sys.modules["resources"].__file__, "runs": {}}
    clicks = clicks_paths()
    views_in = os.path.join(home, "views", "incoming")

    def run(job: str, config: dict | None = None, tags: dict | None = None) -> dict:
        result = defs.resolve_job_def(job).execute_in_process(instance=instance, run_config=config, tags=tags,
                                                              raise_on_error=False)
        mats = [e.event_specific_data.materialization for e in result.all_events if e.is_step_materialization]
        md = {k: v.value for m in mats for k, v in m.metadata.items()
              if isinstance(v.value, (int, str, float, bool, type(None)))}
        failure = next((e.message for e in result.all_events if e.is_failure), None)
        out["runs"].setdefault(job, []).append({"success": result.success, "metadata": md, "failure": failure})
        return md

    with dg.instance_for_test() as instance:
        write_files(clicks["incoming"], 0, 2)
        write_files(views_in, 0, 3)
        run("clicks_job")
        run("views_job")
        time.sleep(1.1)
        write_files(clicks["incoming"], 2, 4)
        second = run("clicks_job")
        # the launchpad's run config: roll back to the first batch, then reprocess from there
        run("clicks_job", {"ops": {"clicks": {"config": {"rollback_to_batch": 0}}}})
        # a reprocessing request, through the request sensor
        requests = os.path.join(home, "reprocess-requests")
        os.makedirs(requests, exist_ok=True)
        with open(os.path.join(requests, "clicks-again.json"), "w") as f:
            json.dump({"asset": "clicks", "to_batch": 0, "id": "INC-7"}, f)
        sensor = defs.resolve_sensor_def("reprocess_request_sensor")
        tick = sensor.evaluate_tick(dg.build_sensor_context(
            instance=instance, resources={"streaming_settings": defs.resources["streaming_settings"]}))
        out["sensor_run_requests"] = [{"job": r.job_name, "config": r.run_config} for r in tick.run_requests]
        for request in tick.run_requests:
            run(request.job_name, request.run_config, {**request.tags, "dagster/run_key": request.run_key})
        out["second_run_last_batch"] = second.get("last_committed_batch")

    from pyspark.sql import SparkSession

    spark = SparkSession.builder.getOrCreate()
    out["clicks_rows"] = sorted([r["key"], r["value"]] for r in spark.read.parquet(clicks["output"]).collect())
    out["views_rows"] = sorted([r["key"], r["value"]] for r in spark.read.parquet(
        os.path.join(home, "views", "output")).collect())
    out["clicks_expected"], out["views_expected"] = expected(4), expected(3)
    print("DRIVE-RESULT " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
