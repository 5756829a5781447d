"""Shared fixtures: one Spark session, real checkpoints per state-store flavour, an S3 server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from tests.spark_runs import FLAVOURS, generate, make_session

HERE = os.path.dirname(__file__)


@pytest.fixture(scope="session")
def spark():
    session = make_session()
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_runs(spark, tmp_path_factory):
    """flavour -> SparkRun, generated lazily once per test session (about 25 s each)."""
    root = tmp_path_factory.mktemp("spark-runs")
    cache = {}

    def get(flavour):
        if flavour not in cache:
            cache[flavour] = generate(spark, flavour, str(root / flavour))
        return cache[flavour]

    return get


@pytest.fixture(params=sorted(FLAVOURS))
def flavour(request):
    return request.param


@pytest.fixture
def run(spark_runs, flavour):
    """A freshly reset generated checkpoint of the parametrised flavour."""
    r = spark_runs(flavour)
    r.reset()
    yield r
    r.reset()


# ---- S3 ------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server():
    """moto in server mode on loopback; sets AWS_* so s3fs/boto3 reach it. Yields the endpoint URL."""
    port = _free_port()
    env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "s3_server.py"), str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    assert proc.stdout.readline().strip() == "ready", "moto server did not start"
    endpoint = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=endpoint)
    deadline = time.time() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    yield endpoint
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def bucket(s3_server, request):
    """A fresh bucket per test."""
    import boto3

    name = "t-" + request.node.name.lower().replace("_", "-").replace("[", "-").replace("]", "")[:50].strip("-")
    name = f"{name}-{int(time.time() * 1000) % 100000}"
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def fault_proxy(s3_server):
    """The fault-injecting proxy (tests/faulty_s3.py) in front of the S3 server, for the session."""
    from tests.faulty_s3 import FaultyS3

    proxy = FaultyS3(s3_server)
    proxy.start()
    yield proxy
    proxy.stop()


@pytest.fixture
def faulty_s3(fault_proxy, monkeypatch):
    """The proxy with no faults yet (each test sets its own ``FaultPlan``) and a quick retry policy
    (tests wait milliseconds between attempts, not seconds). Clients reach it with
    ``storage_options(faulty_s3)`` or ``--storage-options``; setup and checks go to the server directly."""
    monkeypatch.setenv("CHECKPOINT_OPS_RETRY_BASE_DELAY", "0.01")
    monkeypatch.setenv("CHECKPOINT_OPS_RETRY_MAX_DELAY", "0.2")
    fault_proxy.clear()
    yield fault_proxy
    fault_proxy.clear()
