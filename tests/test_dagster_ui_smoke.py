"""Smoke test of the example as `make ui` serves it: `dagster dev` on the workspace with the instance settings
of dagster_home/dagster.yaml; a materialization and a rollback-and-reprocess launched through GraphQL with
launchpad config, as the UI launches them; a backup launched alongside never overlaps the stream (one pool
per checkpoint); and a request file dropped for the running sensor becomes a reprocessing run, and is filed
under handled/ when that run ends."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import dagster as dg
import pytest
from dagster_graphql import DagsterGraphQLClient

from checkpoint_ops.model import Checkpoint
from checkpoint_ops.session_settings import session_settings
from pipelines.event_counts import event_rows, write_event_files
from tests.helpers import free_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DONE = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


@pytest.fixture(scope="module")
def dagster_dev(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui")
    home = tmp / "dagster_home"
    home.mkdir()
    shutil.copy(os.path.join(REPO, "dagster_home", "dagster.yaml"), home / "dagster.yaml")  # as `make ui` uses it
    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "DAGSTER_DISABLE_TELEMETRY": "1",
           "CHECKPOINT_OPS_HOME": str(tmp / "ops"), "EXAMPLE_EVENTS_SCHEDULE": ""}
    log = open(tmp / "dev.log", "w")
    proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "dagster"), "dev", "-w", "workspace.yaml",
                             "-h", "127.0.0.1", "-p", str(port)],
                            cwd=REPO, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                os.killpg(proc.pid, signal.SIGKILL)
                pytest.fail(open(tmp / "dev.log").read()[-4000:])
            time.sleep(1)
    try:
        yield port, tmp, home
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def wait(client, run_id, tmp, timeout=300):
    deadline = time.monotonic() + timeout
    status = client.get_run_status(run_id)
    while status not in DONE and time.monotonic() < deadline:
        time.sleep(1)
        status = client.get_run_status(run_id)
    assert status == dg.DagsterRunStatus.SUCCESS, f"run {run_id}: {status}\n" + open(tmp / "dev.log").read()[-4000:]


def step_window(instance, run_id, step) -> tuple[float, float]:
    events = [e for e in instance.all_logs(run_id) if e.is_dagster_event and e.dagster_event.step_key == step]
    start = next(e.timestamp for e in events if e.dagster_event_type == dg.DagsterEventType.STEP_START)
    end = next(e.timestamp for e in events if e.dagster_event_type == dg.DagsterEventType.STEP_SUCCESS)
    return start, end


def read_with_default_compaction(spark, path):
    """Rows of a file sink, read with Spark's default sink-log compact interval (as the example wrote it;
    the shared test session uses a small one)."""
    with session_settings(spark, {"spark.sql.streaming.fileSink.log.compactInterval": None}):
        return spark.read.parquet(path).collect()


def test_launch_rollback_and_reprocess_like_the_ui(dagster_dev, spark):
    port, tmp, home = dagster_dev
    example = tmp / "ops" / "example"
    write_event_files(str(example / "incoming"), 0, 5)
    client = DagsterGraphQLClient("127.0.0.1", port_number=port)

    # the Materialize button: the asset job on one asset, no config
    first = client.submit_job_execution("__ASSET_JOB", asset_selection=["events_stream"])
    wait(client, first, tmp)
    assert Checkpoint.open(str(example / "checkpoints" / "events_stream")).latest_commit == 4

    # Shift+Materialize, launchpad config: roll back to batch 1 and reprocess; a backup launched at once
    rollback = client.submit_job_execution(
        "__ASSET_JOB", asset_selection=["events_stream"],
        run_config={"ops": {"events_stream": {"config": {"rollback_to_batch": 1}}}})
    backup = client.submit_job_execution("checkpoint_backup_job")
    wait(client, rollback, tmp)
    wait(client, backup, tmp)

    instance = dg.DagsterInstance.from_config(str(home))
    mat = instance.get_latest_materialization_event(dg.AssetKey("events_stream")).asset_materialization
    assert mat.metadata["rollback_target_batch"].value == 1
    assert mat.metadata["batch_ids"].value == "2..4"
    s, e = step_window(instance, rollback, "events_stream")
    bs, be = step_window(instance, backup, "backup_events_stream")
    assert e <= bs or be <= s, "the backup ran while the stream ran (the pool admits one at a time)"

    rows = sorted((r["key"], r["value"]) for r in read_with_default_compaction(spark, str(example / "events")))
    assert rows == sorted((r["key"], r["value"]) for i in range(5) for r in event_rows(i))  # once each

    # the running sensor turns a dropped request into a reprocessing run
    requests = tmp / "ops" / "reprocess-requests"
    requests.mkdir(parents=True, exist_ok=True)
    (requests / "smoke.json").write_text(json.dumps({"asset": "events_stream", "to_batch": 3, "id": "smoke-1"}))
    deadline = time.monotonic() + 240
    runs = []
    while not runs and time.monotonic() < deadline:
        time.sleep(2)
        runs = instance.get_runs(filters=dg.RunsFilter(tags={"dagster/run_key": "events_stream:smoke-1"}))
    assert runs, "the sensor did not launch the request\n" + open(tmp / "dev.log").read()[-4000:]
    wait(client, runs[0].run_id, tmp)
    mat = instance.get_latest_materialization_event(dg.AssetKey("events_stream")).asset_materialization
    assert mat.metadata["rollback_target_batch"].value == 3 and mat.metadata["batch_ids"].value == "4..4"
    # the run ended: the sensor's next evaluation files the request under handled/ with the outcome
    note = requests / "handled" / "smoke.json.reason.txt"
    deadline = time.monotonic() + 120
    while not note.exists() and time.monotonic() < deadline:
        time.sleep(2)
    assert note.exists(), "the sensor did not file the request\n" + open(tmp / "dev.log").read()[-4000:]
    assert note.read_text().startswith(f"succeeded: run {runs[0].run_id}")
    assert not (requests / "smoke.json").exists()
