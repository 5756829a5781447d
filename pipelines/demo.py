"""``make demo``: the example definitions end to end with the Dagster machinery, on local Spark and
local directories under ``demo_data/`` (wiped first).

1. events arrive; both streaming assets materialize (each run checked by ``checkpoint_health_check``);
2. ``checkpoint_backup_job`` backs both checkpoints up (verified);
3. a bad upstream file lands and is processed; upstream then delivers the corrected file;
4. an on-call engineer drops reprocessing requests ("back to before the bad file landed");
5. ``reprocess_request_sensor`` is evaluated and the runs it asks for are executed: each rolls its
   checkpoint and sink back and reprocesses in one materialization; the next tick marks them handled;
6. the outputs equal the expected rows (every event once, corrected; every window's exact count and sum);
7. the backup is restored elsewhere, checked with fsck, and Spark resumes from it to the same output;
8. a summary table.
"""

import json
import os
import shutil
import sys
import time
from datetime import datetime, timezone

import dagster as dg

from checkpoint_ops.backup import Repository, list_backups
from checkpoint_ops.backup.restore import RestoreOperation
from checkpoint_ops.operation import RunOptions, run
from checkpoint_ops.fsck import run_fsck
from checkpoint_ops.model import Checkpoint
from checkpoint_ops.model.checkpoint import open_sink
from dagster_checkpoint_ops import LOCAL_SPARK, StreamingQuery, streaming_definitions
from pipelines.event_counts import (FLUSH_KEY, event_rows, events_writer, expected_windows, flush_files,
                                    read_output, write_bad_event_file, write_event_files)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_HOME = os.path.join(REPO, "demo_data")

QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
ASSETS = ("events_stream", "event_counts")
GOOD, BAD, LATE = 6, 6, 3  # files 0..5 arrive good; file 6 arrives bad, with good files 7 and 8


def banner(text: str) -> None:
    print(f"\n=== {text} " + "=" * max(0, 76 - len(text)), flush=True)


def say(text: str) -> None:
    print(f"  {text}", flush=True)


def materialize(defs, instance, name, config=None, tags=None) -> dict:
    run_config = {**QUIET, **({"ops": {name: {"config": config}}} if config else {})}
    result = defs.resolve_job_def(f"{name}_job").execute_in_process(instance=instance, run_config=run_config,
                                                                     tags=tags, raise_on_error=False)
    if not result.success:
        failure = next((e for e in result.all_events if e.is_failure), None)
        sys.exit(f"demo: {name} failed: {failure.message if failure else result.all_events[-1].message}")
    (mat,) = result.asset_materializations_for_node(name)
    md = {k: v.value for k, v in mat.metadata.items()}
    checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
    line = f"{name}: batches {md.get('batch_ids')}, {md.get('input_rows')} input rows"
    if "rollback_target_batch" in md:
        line = (f"{name}: rolled back to batch {md['rollback_target_batch']} "
                f"({md['rollback_counts']}), then reprocessed batches {md['batch_ids']}")
    say(f"{line}; checkpoint_health_check {'passed' if checks.get('checkpoint_health_check') else 'FAILED'}")
    for w in md.get("rollback_warnings") or []:
        say(f"  warning: {w}")
    return md


def events_rows(spark, path: str) -> list[tuple[str, int]]:
    return sorted((r["key"], r["value"]) for r in spark.read.parquet(path).collect() if r["key"] != FLUSH_KEY)


def sensor_tick(defs, instance, cursor):
    ctx = dg.build_sensor_context(instance=instance, cursor=cursor,
                                  resources={"streaming_settings": defs.resources["streaming_settings"]})
    return defs.resolve_sensor_def("reprocess_request_sensor").evaluate_tick(ctx)


def fresh_example():
    """The example definitions with their home in a wiped ``demo_data/`` (they read it when imported)."""
    os.environ["CHECKPOINT_OPS_HOME"] = DEMO_HOME
    if os.path.isdir(DEMO_HOME):
        shutil.rmtree(DEMO_HOME)
    from pipelines import definitions as example

    return example


def main() -> int:
    example = fresh_example()
    defs, home = example.defs, example.HOME
    summary: list[tuple[str, str, str]] = []
    os.makedirs(os.path.join(DEMO_HOME, "dagster"))
    with dg.DagsterInstance.local_temp(tempdir=os.path.join(DEMO_HOME, "dagster"),
                                       overrides={"telemetry": {"enabled": False},
                                                  # one run per checkpoint at a time, as docs/dagster.md advises
                                                  "concurrency": {"pools": {"default_limit": 1}}}) as instance:
        banner("1. Events arrive; both streaming assets materialize")
        write_event_files(example.EVENTS_IN, 0, GOOD)
        say(f"{GOOD} JSON event files in {example.EVENTS_IN}")
        for name in ASSETS:
            materialize(defs, instance, name)
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.getOrCreate()  # the session the assets ran in
        spark.sparkContext.setLogLevel("ERROR")

        banner("2. checkpoint_backup_job backs up both checkpoints")
        result = defs.resolve_job_def("checkpoint_backup_job").execute_in_process(instance=instance, run_config=QUIET)
        assert result.success
        for obs in (e.asset_observation_data.asset_observation for e in result.all_events
                    if e.event_type == dg.DagsterEventType.ASSET_OBSERVATION):
            md = {k: v.value for k, v in obs.metadata.items()}
            say(f"{obs.asset_key.to_user_string()}: backup {md['backup_id']} at batch {md['backup_batch']}, "
                f"{md['backup_files']} files, verified={md['backup_verified']} -> {md['backup_destination']}")
            summary.append((f"{obs.asset_key.to_user_string()}: backup", f"at batch {md['backup_batch']}",
                            f"{md['backup_files']} files, verified={md['backup_verified']}"))

        banner("3. A bad upstream file lands, and is processed")
        time.sleep(1.1)
        before_bad = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        time.sleep(1.1)
        write_bad_event_file(example.EVENTS_IN, BAD)
        write_event_files(example.EVENTS_IN, BAD + 1, BAD + LATE)
        say(f"events-{BAD:05d}.json arrives with every value x1000 (after {before_bad}), then two good files")
        for name in ASSETS:
            materialize(defs, instance, name)
        worst = max(v for _, v in events_rows(spark, example.EVENTS_OUT))
        say(f"largest value in events_stream's output: {worst} (no event value is above {10 * (BAD + LATE)})")
        summary.append(("bad file processed", f"events-{BAD:05d}.json", f"largest value in the output: {worst}"))
        write_event_files(example.EVENTS_IN, BAD, BAD + 1)
        say(f"upstream delivers the corrected events-{BAD:05d}.json")

        banner("4. On call: drop reprocessing requests")
        requests = os.path.join(home, "reprocess-requests")
        os.makedirs(requests, exist_ok=True)
        for name in ASSETS:
            path = os.path.join(requests, f"{name}-bad-file.json")
            doc = {"asset": name, "to_time": before_bad, "id": f"INC-42-{name}"}
            with open(path, "w") as f:
                json.dump(doc, f)
            say(f"{os.path.relpath(path, REPO)}: {json.dumps(doc)}")

        banner("5. reprocess_request_sensor asks for the runs; each rolls back and reprocesses")
        tick = sensor_tick(defs, instance, None)
        for req in tick.run_requests:
            say(f"run requested: job {req.job_name}, run_key {req.run_key}, config {req.run_config['ops']}")
            name = next(iter(req.run_config["ops"]))
            md = materialize(defs, instance, name, req.run_config["ops"][name]["config"],
                             tags={**req.tags, "dagster/run_key": req.run_key})
            summary.append((f"{name}: rollback", f"to batch {md['rollback_target_batch']}",
                            f"reprocessed {md['batch_ids']} (operation {md['rollback_op_id']})"))
        again = sensor_tick(defs, instance, tick.cursor)
        assert not again.run_requests, "a handled request was asked for again"
        say(f"next tick: no new run ({len(os.listdir(os.path.join(requests, 'handled'))) // 2} requests moved to "
            "handled/, each with its run id beside it)")

        banner("6. The outputs equal the expected rows")
        flush_files(example.EVENTS_IN, BAD + LATE - 1)  # two far-future events close every window
        for name in ASSETS:
            materialize(defs, instance, name)
        want = sorted((r["key"], r["value"]) for i in range(BAD + LATE) for r in event_rows(i))
        got = events_rows(spark, example.EVENTS_OUT)
        ok_events = got == want
        say(f"events_stream: {len(got)} rows, expected {len(want)}, each exactly once and corrected: {ok_events}")
        counts, expected = read_output(spark, example.COUNTS_OUT), expected_windows(range(BAD + LATE))
        ok_counts = counts == {k: [v] for k, v in expected.items()}
        say(f"event_counts: {len(counts)} windows x keys, each once with the exact count and sum: {ok_counts}")
        summary.append(("events_stream output", f"{len(got)} rows", "exact" if ok_events else "WRONG"))
        summary.append(("event_counts output", f"{len(counts)} windows", "exact" if ok_counts else "WRONG"))

        banner("7. The backup, restored elsewhere, checked, and resumed by Spark")
        dest = defs.resources["streaming_settings"].backup_dest("events_stream")
        repo = Repository.open(dest)
        backup = list_backups(repo)[0]
        target = os.path.join(DEMO_HOME, "restored")
        ckpt, out = os.path.join(target, "checkpoint"), os.path.join(target, "events")
        restored = run(RestoreOperation(dest, backup.id, ckpt, [out]), RunOptions(yes=True)).outcome
        say(f"restored backup {backup.id} (batch {backup.batch}) into {os.path.relpath(target, REPO)} "
            f"(operation {restored.op_id}); as a command: checkpoint-ops backup restore {dest} "
            f"{backup.id} {ckpt} --sink-target {out} --yes")
        findings = run_fsck(Checkpoint.open(ckpt), [open_sink(out)])
        say(f"fsck of the restored copy: {len(findings)} findings")
        copy = StreamingQuery(name="events_stream_restored", checkpoint=ckpt, sinks=[out],
                              build=lambda s: events_writer(s, example.EVENTS_IN, out))
        copy_defs = streaming_definitions([copy], home=os.path.join(target, "home"), spark_config=LOCAL_SPARK)
        md = materialize(copy_defs, instance, copy.name)
        ok_copy = events_rows(spark, out) == want
        say(f"the restored copy caught up from batch {backup.batch + 1}: same rows as events_stream: {ok_copy}")
        summary.append(("backup restored elsewhere", f"batch {backup.batch}",
                        f"fsck {len(findings)} findings; resumed {md['batch_ids']}; "
                        + ("same output" if ok_copy else "DIFFERENT output")))

    banner("Summary")
    width = max(len(a) for a, _, _ in summary)
    for a, b, c in summary:
        print(f"  {a:<{width}}  {b:<20}  {c}")
    ok = ok_events and ok_counts and ok_copy and not findings
    print(f"\n{'demo passed' if ok else 'demo FAILED'}: everything it made is in {os.path.relpath(DEMO_HOME, REPO)}/; "
          "`make ui` serves the same definitions on http://127.0.0.1:3000", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
