"""Child process of the Spark Connect test: the factory's definitions driven through ``spark_remote``.

A process holds either a classic Spark session or a Spark Connect one, never both, so this runs apart
from the test (which keeps a classic session). Prints one JSON line: each run's success and metadata.

    python -m tests.connect_client sc://127.0.0.1:15002 <base dir> <home>
"""

import json
import sys

import dagster as dg

from pipelines.event_counts import flush_files, write_bad_event_file, write_event_files
from dagster_checkpoint_ops.streaming import streaming_definitions
from tests.dagster_queries import counts_query, totals_query


def main(remote: str, base: str, home: str) -> None:
    counts, totals = counts_query(f"{base}/counts", name="remote_counts"), totals_query(f"{base}/totals", "remote_totals")
    defs = streaming_definitions([counts, totals], home=home, spark_remote=remote)
    runs = []

    def run(name, **config):
        r = defs.resolve_job_def(f"{name}_job").execute_in_process(
            instance=instance, raise_on_error=False, run_config={"ops": {name: {"config": config}}} if config else None)
        mats = r.asset_materializations_for_node(name) if r.success else []
        runs.append({"asset": name, "success": r.success, "config": config,
                     "metadata": {k: v.value for k, v in mats[0].metadata.items()} if mats else {},
                     "failure": None if r.success else str(r.get_step_failure_events()[:1])})
        return runs[-1]

    inp = f"{base}/counts/input"
    with dg.instance_for_test() as instance:
        # the file sink: a bad batch, corrected and reprocessed
        write_event_files(inp, 0, 4)
        good_until = run("remote_counts")["metadata"]["last_committed_batch"]
        write_bad_event_file(inp, 4)
        write_event_files(inp, 5, 7)
        run("remote_counts")
        write_event_files(inp, 4, 5)  # the corrected file
        run("remote_counts", rollback_to_batch=good_until)
        flush_files(inp, 6)
        run("remote_counts")
        # foreachBatch: the function travels to the server; batches after 0 run again
        write_event_files(f"{base}/totals/input", 0, 3)
        run("remote_totals")
        run("remote_totals", rollback_to_batch=0)
    print(json.dumps({"good_until": good_until, "runs": runs}, default=str))


if __name__ == "__main__":
    main(*sys.argv[1:4])
