"""The holder record behind leases, backup intents and prune locks: when a claim is stale."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from checkpoint_ops.liveness import Heartbeat, Holder, pid_running, process_start


def _dead_pid() -> tuple[int, str | None]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    started = process_start(proc.pid)
    proc.kill()
    proc.wait()
    return proc.pid, started


def test_a_live_holder_on_this_host_is_not_stale():
    me = Holder.me("test", ttl_s=60)
    assert me.stale_reason() is None
    assert me.is_mine()
    assert Holder.from_dict(me.to_dict()) == me


def test_a_dead_process_on_this_host_makes_its_claim_stale_at_once():
    pid, started = _dead_pid()
    holder = Holder(**{**Holder.me("killed", ttl_s=3600).to_dict(), "pid": pid, "pid_start": started})
    assert not pid_running(pid, started)
    assert f"pid {pid} on this host" in holder.stale_reason()


def test_a_reused_pid_is_not_its_first_owner():
    me = Holder.me("test")
    assert pid_running(os.getpid(), me.pid_start)
    if me.pid_start is not None:  # Linux: the start time tells a reused pid apart
        assert not pid_running(os.getpid(), str(int(me.pid_start) + 1))


def test_a_lapsed_heartbeat_makes_a_claim_from_another_host_stale():
    me = Holder.me("elsewhere", ttl_s=60)
    other = Holder(**{**me.to_dict(), "host": "another-host"})
    assert other.stale_reason(now=me.heartbeat_ms / 1000 + 30) is None
    assert "last heartbeat" in other.stale_reason(now=me.heartbeat_ms / 1000 + 61)
    assert other.renewed(now=me.heartbeat_ms / 1000 + 61).stale_reason(now=me.heartbeat_ms / 1000 + 62) is None


def test_records_that_are_not_holders_are_recognised():
    assert Holder.from_dict({"owner": "x"}) is None
    assert Holder.from_dict(["not", "a", "dict"]) is None


def test_heartbeat_renews_until_stopped_and_keeps_a_failure():
    calls = threading.Semaphore(0)
    with Heartbeat(calls.release, 0.01):
        assert calls.acquire(timeout=10) and calls.acquire(timeout=10)

    def fail():
        raise OSError("store unreachable")

    beat = Heartbeat(fail, 0.01).start()
    beat._thread.join(10)
    assert isinstance(beat.error, OSError)
    beat.stop()


def test_stopping_a_heartbeat_waits_for_a_hung_renewal_no_longer_than_asked():
    """``stop(timeout)`` leaves a renewal that does not return (a store that hangs) on its daemon thread
    and says so; once that renewal returns, no other starts."""
    entered, hung = threading.Event(), threading.Event()
    calls = []

    def renew():
        calls.append(1)
        entered.set()
        hung.wait(30)

    beat = Heartbeat(renew, 0.01).start()
    assert entered.wait(10)
    assert beat.stop(timeout=0.2) is False
    assert beat._thread.is_alive()
    hung.set()
    assert beat.stop(timeout=10) is True
    assert calls == [1]

