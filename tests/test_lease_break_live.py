"""``lease break`` never removes the lease of a live process on this host (a running query under
``hold_lease_while_active``, which breaking would not stop at once), and for a live holder on another host warns
what breaking does for its kind of holder; a query whose lease is taken from it (its heartbeat lapsed while its
process was paused) is stopped. Fast tier: no Spark; the query is a stand-in with ``isActive`` and ``stop()``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from checkpoint_ops.lease import LEASE_NAME, acquire, read_lease
from checkpoint_ops.liveness import OPERATION, RUN, Holder
from checkpoint_ops.storage import open_file_manager
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
    (RUN, ["another-host.example", "within about 20 s plus its watcher's poll, 5 s by default", "let that time pass"]),
    (None, ["if it is a checkpoint-ops operation", "may not stop it"]),  # a record without its kind: both
])
def test_a_live_remote_query_is_broken_with_a_warning_of_what_follows(tmp_path, kind, says):
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


WATCHED = """
import json, sys, time
from checkpoint_ops.lease import LeaseLost
from checkpoint_ops.spark import hold_lease_while_active
class Q:
    name = "stand-in-query"
    isActive = True
    def stop(self):
        self.isActive = False
        print("stopped", flush=True)
query = Q()
held = hold_lease_while_active(query, sys.argv[1], poll_s=0.1)
print("holding", flush=True)
deadline = time.time() + 30
while query.isActive and time.time() < deadline:
    time.sleep(0.05)
if query.isActive:
    print("still running", flush=True)
try:
    held.release()
    print(json.dumps(None), flush=True)
except LeaseLost as e:
    print(json.dumps(e.to_dict()), flush=True)
"""


def test_a_query_whose_lease_was_taken_over_while_its_process_was_paused_is_stopped(tmp_path):
    """A paused driver (SIGSTOP, a VM frozen, a long GC pause) renews nothing, while Spark's JVM may go on
    running the query: past the time to live, a command takes the stale lease over and may change the
    checkpoint. Resumed, the holder's heartbeat finds the record not its own; the query is stopped, and the
    block's end raises ``LeaseLost`` naming what happened. The taker's record stays."""
    root = str(tmp_path / "root")
    os.makedirs(root)
    env = {**os.environ, "PYTHONPATH": ROOT, "CHECKPOINT_OPS_LEASE_TTL": "2"}  # renewed every 0.67 s
    proc = subprocess.Popen([sys.executable, "-c", WATCHED, root], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, text=True)
    fm, top = open_file_manager(root)
    try:
        assert proc.stdout.readline().strip() == "holding"
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(2.5)  # past its time to live: its record is stale
        taker = acquire(fm, top, "checkpoint-ops rollback", ttl_s=60)
        try:
            assert taker.notes and "took over" in " ".join(taker.notes).lower(), taker.notes
            os.kill(proc.pid, signal.SIGCONT)
            assert proc.stdout.readline().strip() == "stopped"
            outcome = json.loads(proc.stdout.readline())
            assert outcome is not None and outcome["error"] == "LeaseLost", outcome
            assert "taken from this process" in outcome["problem"], outcome
            assert "stand-in-query was stopped" in outcome["problem"], outcome
            assert "checkpoint-ops rollback" in outcome["problem"], outcome  # who holds it now
            assert "lease show" in outcome["fix"] and "hold_lease_while_active" in outcome["fix"], outcome
            assert proc.wait(timeout=30) == 0
            assert "stand-in-query was stopped" in proc.stderr.read()  # logged when it happened, as an error
            assert read_lease(fm, top).holder.token == taker.holder.token  # its release left the taker's record
        finally:
            taker.release()
    finally:
        os.kill(proc.pid, signal.SIGCONT) if proc.poll() is None else None
        proc.kill()
        proc.wait(timeout=30)
    assert os.listdir(root) == []
