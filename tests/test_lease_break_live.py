"""``lease break`` never removes the lease of a live process on this host (a running query under
``hold_lease_while_active``, which breaking would not stop), and for a live holder on another host warns
what breaking does for its kind of holder. Fast tier: no Spark; the query is a stand-in with ``isActive``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from checkpoint_ops.lease import LEASE_NAME
from checkpoint_ops.liveness import OPERATION, RUN, Holder
from tests.helpers import cli_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HOLD = """
import sys, time
from checkpoint_ops.spark import hold_lease_while_active
class Q:
    isActive = True
    name = "stand-in-query"
hold_lease_while_active(Q(), sys.argv[1], poll_s=0.2)
print("holding", flush=True)
sys.stdin.read()  # until the test closes it
"""


def test_a_live_query_on_this_host_keeps_its_lease(tmp_path):
    root = str(tmp_path / "root")  # its journal would go beside it, in tmp_path (not shared with other tests)
    os.makedirs(root)
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen([sys.executable, "-c", HOLD, root], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=env, text=True)
    try:
        assert proc.stdout.readline().strip() == "holding"
        record = json.loads(open(os.path.join(root, LEASE_NAME)).read())
        assert record["kind"] == RUN and record["pid"] == proc.pid
        before = open(os.path.join(root, LEASE_NAME), "rb").read()
        code, doc = cli_json("lease", "break", root, "--yes")
        assert code == 1, doc
        assert doc["error"] == "RefusedError" and f"pid {proc.pid}" in doc["problem"], doc
        assert "live process on this host" in doc["problem"] and "running query" in doc["problem"], doc
        assert "stop it first" in doc["fix"], doc
        assert os.path.exists(os.path.join(root, LEASE_NAME))  # nothing changed
        assert json.loads(open(os.path.join(root, LEASE_NAME), "rb").read())["token"] == json.loads(before)["token"]
        assert not os.path.exists(os.path.join(os.path.dirname(root), ".checkpoint-ops"))  # nothing journaled
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def _remote(root: str, kind: str | None) -> None:
    now = int(time.time() * 1000)
    holder = Holder("spark query q (hold_lease_while_active)" if kind != OPERATION else "checkpoint-ops rollback",
                    "another-host.example", 4242, None, "cafe" * 8, now, now, 60.0, kind)
    with open(os.path.join(root, LEASE_NAME), "w") as f:
        json.dump(holder.to_dict(), f)


@pytest.mark.parametrize("kind, says", [
    (RUN, ["another-host.example", "does not stop it"]),  # a query goes on: no "resume finishes it"
    (None, ["if it is a checkpoint-ops operation", "does not stop it"]),  # a record without its kind: both
])
def test_a_live_remote_query_is_broken_with_a_warning_that_it_goes_on(tmp_path, kind, says):
    root = str(tmp_path)
    _remote(root, kind)
    code, doc = cli_json("lease", "break", root, "--dry-run")
    assert code == 0, doc
    [warning] = doc["plan"]["warnings"]
    assert all(s in warning for s in says), warning
    assert kind is None or "resume" not in warning, warning


def test_a_live_remote_operation_is_broken_with_a_warning_that_it_stops(tmp_path):
    root = str(tmp_path)
    _remote(root, OPERATION)
    code, doc = cli_json("lease", "break", root, "--yes")
    assert code == 0 and doc["result"] is not None, doc
    [warning] = doc["plan"]["warnings"]
    assert "stops its operation at its next heartbeat" in warning and "does not stop" not in warning, warning
    assert not os.path.exists(os.path.join(root, LEASE_NAME))
