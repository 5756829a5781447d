"""The same definitions drive a remote Spark through Spark Connect: a local Spark Connect server (the
start-connect-server.sh that ships with PySpark), a streaming asset materialized through it, a rollback
and reprocess included, and the output exact."""

import json
import os
import socket
import subprocess
import sys
import time

import pyspark
import pytest

from pipelines.event_counts import expected_windows, read_output
from tests.helpers import free_port
from tests.dagster_queries import expected_totals, read_totals

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPARK_HOME = os.path.dirname(pyspark.__file__)


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spark-connect")
    port = free_port()
    env = {**os.environ, "SPARK_HOME": SPARK_HOME, "SPARK_LOG_DIR": str(tmp / "logs"),
           "SPARK_PID_DIR": str(tmp), "PYSPARK_PYTHON": sys.executable}
    script = os.path.join(SPARK_HOME, "sbin", "start-connect-server.sh")
    subprocess.run(["bash", script, "--conf", f"spark.connect.grpc.binding.port={port}",
                    "--conf", "spark.master=local[2]", "--conf", "spark.ui.enabled=false",
                    "--conf", "spark.sql.shuffle.partitions=2", "--conf", "spark.sql.session.timeZone=UTC",
                    "--conf", "spark.sql.streaming.stateStore.maintenanceInterval=2s"],
                   env=env, check=True, capture_output=True, timeout=120)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    logs = "".join(open(os.path.join(tmp / "logs", n)).read()[-3000:]
                                   for n in os.listdir(tmp / "logs"))
                    pytest.fail(f"Spark Connect server did not listen on {port}:\n{logs}")
                time.sleep(1)
        yield f"sc://127.0.0.1:{port}"
    finally:
        subprocess.run(["bash", os.path.join(SPARK_HOME, "sbin", "stop-connect-server.sh")], env=env,
                       capture_output=True, timeout=120)


def test_streaming_asset_through_spark_connect(spark, tmp_path, connect_server):
    base, home = tmp_path / "q", tmp_path / "home"
    p = subprocess.run([sys.executable, "-m", "tests.connect_client", connect_server, str(base), str(home)],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-5000:]
    report = json.loads(p.stdout.strip().splitlines()[-1])
    runs = report["runs"]
    failed = [(r["asset"], r["config"], r["failure"]) for r in runs if not r["success"]]
    assert not failed, failed  # the failing step's error, whole (the runs' repr truncates it)
    first, _, rolled, _, totals, totals_rolled = runs
    assert first["metadata"]["input_rows"] == 20
    # the compat step judged each later run through Spark Connect (no plan fingerprint there: always restarted)
    assert first["metadata"]["compat_spark_restart"] == "not needed (new checkpoint)"
    assert all(r["metadata"]["compat_spark_restart"].startswith("restarted batch") for r in runs[1:4]), runs
    assert totals_rolled["metadata"]["compat"] == "compatible"  # foreachBatch replaced by noop on the server
    assert rolled["metadata"]["rollback_target_batch"] == report["good_until"]
    assert rolled["metadata"]["batch_ids"].startswith(f"{report['good_until'] + 1}..")
    assert rolled["metadata"]["input_rows"] == 15  # the corrected file and the two after it
    # the remote server wrote the sink; read it here: every window once, corrected
    assert read_output(spark, str(base / "counts" / "output")) == {
        k: [v] for k, v in expected_windows(range(7)).items()}
    assert totals["metadata"]["batch_ids"] == "0..2"
    assert totals_rolled["metadata"]["batch_ids"] == "1..2" and totals_rolled["metadata"]["input_rows"] == 10
    assert read_totals(spark, str(base / "totals" / "output"), 2) == expected_totals(range(3))
