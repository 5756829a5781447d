"""Shared fixtures: one Spark session, real checkpoints per state-store flavour, an S3 server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from tests.operator_runs import QUERIES, generate_operator_run
from tests.spark_runs import FLAVOURS, generate, generate_pair_runs, make_session

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


@pytest.fixture(scope="session")
def operator_runs(spark, tmp_path_factory):
    """(query name, flavour) -> OperatorRun of tests/operator_runs.py, generated lazily once per session."""
    root = tmp_path_factory.mktemp("operator-runs")
    cache = {}

    def get(query: str, flavour: str):
        if (query, flavour) not in cache:
            cache[query, flavour] = generate_operator_run(spark, QUERIES[query], flavour, str(root / f"{query}-{flavour}"))
        return cache[query, flavour]

    return get


# The files that take longest, longest first (from ``--durations=0`` of a whole run). ``make test`` runs the suite on
# two workers, a file to a worker (``-n 2 --dist loadfile --no-loadscope-reorder``), handing out files in collection
# order: starting with these keeps one long file from running alone at the end while the other worker waits.
LONGEST_FIRST = (  # seconds in a run on two workers, 2026-11-29
    "test_crash_matrix.py",  # 529
    "test_operators_spark.py",  # 318
    "test_bad_input_corpus.py",  # 312
    "test_rollback_spark.py",  # 206
    "test_dagster_ui_smoke.py",  # 206
    "test_fault_matrix.py",  # 193
    "test_dagster_streaming.py",  # 188
    "test_dagster_spark_connect.py",  # 187
    "test_package_install.py",  # 169
    "test_restore_visibility_spark.py",  # 149
    "test_recovery_guards.py",  # 121
    "test_backup_destination.py",  # 120
    "test_backup_spark.py",  # 117
    "test_compat_spark.py",  # 113
)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``operators_full`` (the rest of the operator x state store matrix) run only when
    ``-m`` names that marker (``make test-operators``); the default run deselects them. The files in
    ``LONGEST_FIRST`` come first, in that order; the rest, and the tests inside each file, keep their order."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
    if "operators_full" in (config.getoption("markexpr") or ""):
        return
    keep = [item for item in items if item.get_closest_marker("operators_full") is None]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep


@pytest.fixture(scope="session")
def pair_runs(spark, tmp_path_factory):
    """Small stateless queries, generated once per session: "a" and "b" write two outputs, "inside" keeps its
    checkpoint inside its output (name -> QueryRun)."""
    return generate_pair_runs(spark, str(tmp_path_factory.mktemp("pair-runs")))


@pytest.fixture
def pairs(pair_runs):
    """``pair_runs``, each reset to its pristine tree before and after the test."""
    for r in pair_runs.values():
        r.reset()
    yield pair_runs
    for r in pair_runs.values():
        r.reset()


@pytest.fixture(scope="session")
def compat_bases(spark, tmp_path_factory):
    """name -> CompatBase (tests/compat_queries.py), each generated once per test session (a few seconds)."""
    from tests.compat_queries import generate_base

    root = tmp_path_factory.mktemp("compat-bases")
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = generate_base(spark, name, str(root / name))
        return cache[name]

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
