"""The lease itself (``checkpoint_ops/lease.py``), without Spark: a holder whose renewal is slow stops
before anyone may take its lease over, and never goes on beside the process that did; a takeover
interrupted after its claim does not block every later command.

S3 cases run against the moto server, through the fault proxy (``tests/faulty_s3.py``) where a request
must be slow or fail; the kill is the crash switch (``CHECKPOINT_OPS_KILL_AT``) in a subprocess.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import boto3
import pytest

from checkpoint_ops.lease import LEASE_NAME, TAKEOVER_PREFIX, LeaseHeld, LeaseLost, LeaseSet, acquire, read_lease
from checkpoint_ops.lease_break import LeaseBreakOperation
from checkpoint_ops.liveness import Holder
from checkpoint_ops.operation import RunOptions, run
from checkpoint_ops.storage import open_file_manager
from tests.faulty_s3 import FaultPlan
from tests.helpers import cli_json

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ELSEWHERE = "another-host.example"


def _lapsed_holder(owner: str = "a run on another host") -> Holder:
    """A record of a holder on another host whose heartbeat lapsed an hour ago."""
    an_hour_ago = int((time.time() - 3600) * 1000)
    return Holder(owner, ELSEWHERE, 4242, None, "deadbeef" * 4, an_hour_ago, an_hour_ago, 60.0)


def _record(holder: Holder) -> bytes:
    return json.dumps(holder.to_dict()).encode()


def _passes(lease) -> bool:
    try:
        lease.check()
        return True
    except LeaseLost:
        return False


def _s3_keys(s3_server: str, bucket: str, prefix: str = "root/") -> list[str]:
    resp = boto3.client("s3", endpoint_url=s3_server).list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for o in resp.get("Contents", []))


def _owner_of_record(s3_server: str, bucket: str) -> str:
    body = boto3.client("s3", endpoint_url=s3_server).get_object(Bucket=bucket, Key=f"root/{LEASE_NAME}")["Body"]
    return json.loads(body.read())["owner"]


# ---- a slow renewal: never two holders going on together --------------------------------------------------


def test_a_holder_whose_renewal_is_stuck_stops_before_its_lease_can_be_taken_over(faulty_s3, s3_server, bucket):
    """A's renewal PUT reaches the store 4 s late (ttl 3 s). B takes the lapsed lease over, legitimately.
    From then on A's ``check()`` fails (it stopped before B could take over), and A's late renewal, a PUT
    with ``If-Match`` on the record A had read, is refused by the store: B's record stays, and B goes on
    holding the lease (before conditional renewals, the late PUT replaced B's record and B had to stop
    too). At no moment do both go on."""
    fm_a, root = open_file_manager(f"s3://{bucket}/root", {"endpoint_url": faulty_s3.endpoint})
    fm_b, _ = open_file_manager(f"s3://{bucket}/root", {"endpoint_url": s3_server})
    a = acquire(fm_a, root, "A", ttl_s=3)  # a put-if-absent: not slowed
    b = None
    try:
        acquired = time.monotonic()
        faulty_s3.set_plan(FaultPlan(rate=1.0, faults=("slow",), requests=frozenset({"PUT"}), delay_s=4))
        time.sleep(3.3 - (time.monotonic() - acquired))  # A's record is older than its time to live
        assert read_lease(fm_b, root).stale_reason is not None
        b = acquire(fm_b, root, "B", ttl_s=3)
        assert b.notes and "took over the lease" in b.notes[0]
        with pytest.raises(LeaseLost, match="last renewed"):
            a.check()  # A stopped before B could take over (2.5 s after its acquire)
        deadline = time.monotonic() + 8
        while a._heartbeat.error is None and time.monotonic() < deadline:  # until A's late renewal is answered
            assert not _passes(a), "A and B both believe they hold the lease"
            assert _passes(b)
            time.sleep(0.1)
        a._heartbeat.stop()
        assert isinstance(a._heartbeat.error, LeaseLost) and "refused the late renewal" in str(
            a._heartbeat.error), a._heartbeat.error
        assert _owner_of_record(s3_server, bucket) == "B"  # the late PUT replaced nothing...
        time.sleep(1.2)  # ... and B renews as before, its record its own
        b.check()
        assert _owner_of_record(s3_server, bucket) == "B"
        with pytest.raises(LeaseLost):
            a.check()  # lost for good
    finally:
        faulty_s3.calm()
        a.release()
        if b is not None:
            b.release()
    assert _s3_keys(s3_server, bucket) == []  # B removed its record and its takeover claim


_LATE_HOLDER = """
import os, sys, time
from checkpoint_ops.lease import LeaseLost, acquire
from checkpoint_ops.storage import open_file_manager

where, signals, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])
fm, root = open_file_manager(where)
real_replace = fm.replace_if_same

def paused_replace(path, data, version):  # this renewal has read its record; its write waits
    open(os.path.join(signals, "paused"), "w").close()
    while not os.path.exists(os.path.join(signals, "go")):
        time.sleep(0.01)
    return real_replace(path, data, version)

lease = acquire(fm, root, "A", ttl_s=ttl, stepwise=False)  # a query's run: it renews however late
fm.replace_if_same = paused_replace
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        lease.check()
    except LeaseLost as lost:
        print("LOST", lost.problem, flush=True)
        break
    time.sleep(0.05)
lease.release()
"""


def test_a_late_renewal_stored_over_a_takers_record_stops_both_and_nobody_finds_the_lease_free(tmp_path, monkeypatch):
    """Where a replace cannot be conditional (HDFS; here the rename strategy on local disk), a run's renewal that
    paused between its read and its write for longer than the time to live, while another process took the lease
    over, is stored over the taker's record. The late holder finds the taker's claim (named after its own record),
    stamps its record once more, to be judged by age alone, stops (``LeaseLost``, naming the taker) and exits; the
    taker finds the record not its own and stops. No third process finds the lease free or stale meanwhile, even
    once the taker's claim has aged past the time to live and the late holder's process is gone (before: its record
    carried the stamp of the renewal's read, and a dead process's record is stale at once). A time to live after
    that stamp, one takes it over, and its release leaves nothing. The pause is injected at the store, before the
    write."""
    import subprocess
    import sys

    monkeypatch.setenv("CHECKPOINT_OPS_FILE_MANAGER", "rename")
    ttl = 3.0
    where, signals = tmp_path / "root", tmp_path / "signals"
    os.makedirs(where)
    os.makedirs(signals)
    fm_b, root = open_file_manager(str(where))
    assert not fm_b.conditional_replace
    late = subprocess.Popen([sys.executable, "-c", _LATE_HOLDER, str(where), str(signals), str(ttl)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    b = c = None
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(signals / "paused"):  # A's renewal read its record and waits to write
            assert late.poll() is None and time.monotonic() < deadline, late.communicate()
            time.sleep(0.02)
        time.sleep(ttl + 0.2)  # past A's time to live: its record is stale
        b = acquire(fm_b, root, "B", ttl_s=ttl, heartbeat=False)
        took_over = time.monotonic()
        assert "took over the lease" in b.notes[0], b.notes
        time.sleep(0.8 * ttl)
        (signals / "go").touch()  # A's renewal lands over B's record, late in B's claim's time to live
        out, err = late.communicate(timeout=60)
        assert late.returncode == 0 and "LOST" in out and "taken over by B (host " in out, (out, err)
        state = read_lease(fm_b, root)
        assert state.holder.owner == "A" and state.holder.outlives_process, state.describe()
        with pytest.raises(LeaseLost):
            b.verify()  # B finds the record not its own and stops
        time.sleep(max(0.0, took_over + ttl + 0.2 - time.monotonic()))  # B's claim is past its time to live
        with pytest.raises(LeaseHeld):
            acquire(fm_b, root, "C", heartbeat=False)  # not free, not stale: B may still be stopping
        b.release()
        time.sleep(ttl + 0.1)
        c = acquire(fm_b, root, "C", heartbeat=False)
        assert "took over the lease" in c.notes[0], c.notes
        c.release()
    finally:
        (signals / "go").touch()
        if late.poll() is None:
            late.kill()
        for lease in (b, c):
            if lease is not None:
                try:
                    lease.release()
                except Exception:  # noqa: BLE001 - released already above
                    pass
    left = [n for n in os.listdir(where) if "checkpoint-ops.lease" in n]
    assert not left, left


def test_release_does_not_wait_for_a_renewal_hung_on_the_store(faulty_s3, s3_server, bucket):
    """A renewal PUT held up 8 s by the store (ttl 3 s: a renewal every second). Release waits for it at
    most one renewal interval, then deletes the record; when the late renewal reaches the store, its
    ``If-Match`` names a record that is gone, so it is refused and no record comes back. (Before, release
    joined the renewal for as long as the store took.)"""
    fm, root = open_file_manager(f"s3://{bucket}/root", {"endpoint_url": faulty_s3.endpoint})
    lease = acquire(fm, root, "A", ttl_s=3)
    beat = lease._heartbeat
    try:
        faulty_s3.set_plan(FaultPlan(rate=1.0, faults=("slow",), requests=frozenset({"PUT"}), delay_s=8))
        deadline = time.monotonic() + 5
        while not faulty_s3.stats.faults[("PUT", "slow")]:  # a renewal is held up at the store
            assert time.monotonic() < deadline, faulty_s3.stats
            time.sleep(0.02)
        started = time.monotonic()
        lease.release()
        took = time.monotonic() - started
        assert took < 5, f"release waited {took:.1f} s for a renewal hung on the store"
        assert _s3_keys(s3_server, bucket) == []
        beat._thread.join(30)  # the late renewal is answered (refused)
        assert not beat._thread.is_alive()
        assert isinstance(beat.error, LeaseLost) and "refused the late renewal" in str(beat.error), beat.error
        assert _s3_keys(s3_server, bucket) == []  # it wrote nothing back
    finally:
        faulty_s3.calm()


class _ActiveQuery:
    """What ``hold_lease_while_active`` asks of a streaming query: it stays active until stopped."""

    name = "q"
    isActive = True


def test_a_running_query_keeps_its_lease_through_a_slow_renewal(faulty_s3, s3_server, bucket, monkeypatch):
    """A query's lease (``spark.hold_lease_while_active``) has no steps to stop at: one renewal PUT 2 s late
    (ttl 3 s) must not stop its heartbeat, else its record goes stale while the query runs and any command
    takes the lease over and changes the checkpoint under it. The record stays fresh and another command is
    refused; a renewal the store fails is tried again at the next beat."""
    from checkpoint_ops.spark import hold_lease_while_active

    monkeypatch.setenv("CHECKPOINT_OPS_LEASE_TTL", "3")
    monkeypatch.setenv("CHECKPOINT_OPS_RETRY_ATTEMPTS", "2")  # so that a renewal fails within the outage
    url = f"s3://{bucket}/root"
    held = hold_lease_while_active(_ActiveQuery(), url, poll_s=0.2,
                                   storage_options={"endpoint_url": faulty_s3.endpoint})
    lease = held.leases.leases[0]
    fm_other, root = open_file_manager(url, {"endpoint_url": s3_server})
    try:
        faulty_s3.set_plan(FaultPlan(rate=1.0, faults=("slow",), requests=frozenset({"PUT"}), delay_s=2))
        deadline = time.monotonic() + 5
        while not faulty_s3.stats.faults[("PUT", "slow")]:  # one renewal (each has its own body) is slow
            assert time.monotonic() < deadline, faulty_s3.stats
            time.sleep(0.02)
        faulty_s3.calm()
        time.sleep(3)  # it lands 2 s late, past 5/6 of the ttl since the renewal before it began
        faulty_s3.outage(2.5)  # every request fails: a renewal or two fail after their retries
        faulty_s3.wait_outage_over()
        time.sleep(3.5)  # longer than the ttl: only renewals after the outage keep the record fresh
        assert lease._heartbeat.error is None, lease._heartbeat.error
        assert lease.renew_errors >= 1, faulty_s3.stats
        deadline = time.monotonic() + 5
        while True:  # a renewal just landed: the record is fresh for most of the ttl (the machine may be slow)
            state = read_lease(fm_other, root)
            if state.held and time.time() - state.holder.heartbeat_ms / 1000 < 0.8:
                break
            assert time.monotonic() < deadline, f"no renewal since the outage: {state.describe()}"
            time.sleep(0.05)
        with pytest.raises(LeaseHeld):
            acquire(fm_other, root, "another command", ttl_s=3)
        lease.check()
    finally:
        faulty_s3.calm()
        held.release()
    assert _s3_keys(s3_server, bucket) == []


def test_a_lease_not_renewed_for_most_of_its_time_to_live_is_lost(tmp_path):
    """No renewal succeeded for five sixths of the time to live (here: none started): ``check()`` fails,
    and keeps failing."""
    fm, root = open_file_manager(str(tmp_path))
    lease = acquire(fm, root, "a holder without a heartbeat", ttl_s=1.2, heartbeat=False)
    try:
        lease.check()
        time.sleep(1.1)
        with pytest.raises(LeaseLost, match=r"after 1 s of its 1.2 s time to live"):
            lease.check()
        with pytest.raises(LeaseLost):
            lease.check()
    finally:
        lease.release()
    assert not os.listdir(tmp_path)


# ---- an interrupted takeover ---------------------------------------------------------------------------------


def test_a_takeover_interrupted_by_an_outage_after_its_claim_does_not_block_later_ones(faulty_s3, s3_server,
                                                                                      bucket):
    """The store goes down right after the takeover claim is stored. The failed takeover tries to remove
    its claim (the store is still down); the claim it leaves names this process, which no longer holds it,
    so the next acquire here claims it in turn, takes the lease over, and its release leaves nothing."""
    boto3.client("s3", endpoint_url=s3_server).put_object(Bucket=bucket, Key=f"root/{LEASE_NAME}",
                                                          Body=_record(_lapsed_holder()))
    fm, root = open_file_manager(f"s3://{bucket}/root", {"endpoint_url": faulty_s3.endpoint,
                                                         "retry": {"max_attempts": 2}})
    faulty_s3.outage(3, after_requests=2, of_kind="PUT-IF-NONE-MATCH")  # the lease put (412), then the claim
    with pytest.raises(Exception, match="kept failing"):
        acquire(fm, root, "first", heartbeat=False)
    faulty_s3.wait_outage_over()
    claim = f"root/{TAKEOVER_PREFIX}{'deadbeef' * 4}"
    assert claim in _s3_keys(s3_server, bucket)  # left behind: the store was down

    lease = acquire(fm, root, "second", heartbeat=False)
    assert "past 1 takeover claim(s)" in lease.notes[0], lease.notes
    assert read_lease(fm, root).holder.token == lease.holder.token
    lease.release()
    assert _s3_keys(s3_server, bucket) == []


def test_a_takeover_killed_after_its_claim_does_not_block_later_ones(tmp_path):
    """Killed (SIGKILL, the crash switch) between storing its claim and replacing the lease: the claim
    names a dead process on this host, so the next command claims it in turn and takes the lease over."""
    fm, root = open_file_manager(str(tmp_path))
    fm.write_bytes(os.path.join(root, LEASE_NAME), _record(_lapsed_holder()))
    code = ("import sys; from checkpoint_ops.lease import acquire; from checkpoint_ops.storage import "
            "open_file_manager; fm, root = open_file_manager(sys.argv[1]); acquire(fm, root, 'killed')")
    env = dict(os.environ, CHECKPOINT_OPS_KILL_AT="2")  # 1: the claim; 2: the lease, replaced
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=env, capture_output=True)
    assert proc.returncode == -9, proc.stderr
    claim = TAKEOVER_PREFIX + "deadbeef" * 4
    assert os.path.exists(tmp_path / claim)
    assert read_lease(fm, root).holder.owner == "a run on another host"  # not replaced yet

    lease = acquire(fm, root, "next", heartbeat=False)
    assert "took over the lease" in lease.notes[0] and "past 1 takeover claim(s)" in lease.notes[0]
    lease.release()
    assert not [n for n in os.listdir(tmp_path) if "checkpoint-ops.lease" in n], os.listdir(tmp_path)


def test_takeovers_killed_after_their_claims_many_times_in_a_row_do_not_need_a_person(tmp_path):
    """Each takeover killed between its claim and its write leaves one more claim in the chain the next taker
    walks. Six in a row (before, four needed `lease break`): the next command takes the lease over past all of
    them, and its release leaves nothing."""
    fm, root = open_file_manager(str(tmp_path))
    fm.write_bytes(os.path.join(root, LEASE_NAME), _record(_lapsed_holder()))
    code = ("import sys; from checkpoint_ops.lease import acquire; from checkpoint_ops.storage import "
            "open_file_manager; fm, root = open_file_manager(sys.argv[1]); acquire(fm, root, 'killed')")
    env = dict(os.environ, CHECKPOINT_OPS_KILL_AT="2")  # 1: its claim; 2: the lease, replaced
    for killed in range(1, 7):
        proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=env, capture_output=True)
        assert proc.returncode == -9, proc.stderr.decode()[-2000:]
        claims = [n for n in os.listdir(tmp_path) if n.startswith(TAKEOVER_PREFIX)]
        assert len(claims) == killed, claims
    assert read_lease(fm, root).holder.owner == "a run on another host"  # never replaced

    lease = acquire(fm, root, "next", heartbeat=False)
    assert "took over the lease" in lease.notes[0] and "past 6 takeover claim(s)" in lease.notes[0], lease.notes
    lease.release()
    assert not [n for n in os.listdir(tmp_path) if "checkpoint-ops.lease" in n], os.listdir(tmp_path)


def test_a_takeover_removes_the_claims_the_dead_holder_left_itself(tmp_path):
    """A killed rollback's lease taken over by an undo that was killed too: the undo's claim (named after the
    rollback's lease, holding the undo's record) was left for ever, as no later taker meets that name (the next
    undo claims the undo's lease). A takeover now also removes, at release, the claims whose record is the stale
    holder's own, and every stale claim (here one a dead taker left in a chain the undo walked past); a live
    claim of another taker stays."""
    fm, root = open_file_manager(str(tmp_path))
    dead = _lapsed_holder("a killed undo")
    fm.write_bytes(os.path.join(root, LEASE_NAME), _record(dead))
    its_own = TAKEOVER_PREFIX + "0123abcd" * 4  # named after the lease it took over (a killed rollback's)
    fm.write_bytes(os.path.join(root, its_own), _record(dead))
    someone_else = Holder("another taker", ELSEWHERE, 4545, None, "feed" * 8, int(time.time() * 1000),
                          int(time.time() * 1000), 60.0)
    theirs = TAKEOVER_PREFIX + "5678ef01" * 4
    fm.write_bytes(os.path.join(root, theirs), _record(someone_else))
    walked_past = TAKEOVER_PREFIX + "0123abce" * 4  # a dead taker's, in the chain of a lease long replaced
    long_ago = int((time.time() - 3600) * 1000)
    dead_taker = Holder("a killed rollback's taker", ELSEWHERE, 4343, None, "cafe0123" * 4, long_ago, long_ago, 60.0)
    fm.write_bytes(os.path.join(root, walked_past), _record(dead_taker))

    lease = acquire(fm, root, "next", heartbeat=False)
    assert "took over the lease" in lease.notes[0], lease.notes
    assert os.path.exists(tmp_path / its_own) and os.path.exists(tmp_path / walked_past)  # while the lease is held
    lease.release()
    left = sorted(n for n in os.listdir(tmp_path) if "checkpoint-ops.lease" in n)
    assert left == [f".{theirs}.crc", theirs], left  # its own claim gone with its .crc sidecar


def test_a_live_takeover_claim_in_the_way_is_named_with_lease_break(tmp_path):
    """A claim by a taker on another host that is still within its time to live: the refusal names the
    claim file and says how to remove it (``lease break``), not "wait for it to finish"; nothing changes."""
    fm, root = open_file_manager(str(tmp_path))
    fm.write_bytes(os.path.join(root, LEASE_NAME), _record(_lapsed_holder()))
    taker = Holder("a takeover elsewhere", ELSEWHERE, 4343, None, "cafe" * 8, int(time.time() * 1000),
                   int(time.time() * 1000), 60.0)
    claim = TAKEOVER_PREFIX + "deadbeef" * 4
    fm.write_bytes(os.path.join(root, claim), _record(taker))
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(LeaseHeld) as refused:
        acquire(fm, root, "next")
    err = refused.value
    assert err.path == fm.url(os.path.join(root, claim)), err.path
    assert "a takeover of it was claimed" in str(err) and "a takeover elsewhere" in str(err), str(err)
    assert f"checkpoint-ops lease break {fm.url(root)} --yes" in err.fix and "wait" not in err.fix, err.fix
    assert sorted(os.listdir(tmp_path)) == before


def test_lease_break_removes_takeover_claims_left_beside_a_free_lease(tmp_path):
    """A claim whose taker died after the lease was released (or broken) is litter only ``lease break``
    can see: it removes it, journaled, even though no lease is left to break."""
    fm, root = open_file_manager(str(tmp_path))
    claim = TAKEOVER_PREFIX + "deadbeef" * 4
    fm.write_bytes(os.path.join(root, claim), _record(_lapsed_holder("a killed takeover")))
    code, r = cli_json("lease", "break", str(tmp_path), "--yes")
    assert code == 0 and r["plan"]["summary"]["takeover_claims"] == 1, r
    assert not [n for n in os.listdir(tmp_path) if "checkpoint-ops.lease" in n], os.listdir(tmp_path)


def test_a_record_kept_by_a_holder_that_lost_its_lease_is_shown_and_broken_for_what_it_is(tmp_path):
    """The record a late holder leaves after it lost the lease (``Holder.outlives_process``), its process gone from
    this host: held until it ages out, whatever its pid; ``lease show`` says it holds, and ``lease break`` breaks it
    with a warning of when it would go stale by itself (before, the break was refused as "held by a live process on
    this host ... kill <pid>", naming a process that is gone; a review)."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(gone.stdout)
    now = int(time.time() * 1000)
    kept = Holder("a query's run", socket.gethostname(), pid, None, "cafe" * 8, now - 60_000, now, 600.0, "run",
                  outlives_process=True)
    fm, root = open_file_manager(str(tmp_path))
    fm.write_bytes(os.path.join(root, LEASE_NAME), _record(kept))
    with pytest.raises(LeaseHeld):
        acquire(fm, root, "another command", heartbeat=False)
    code, shown = cli_json("lease", "show", str(tmp_path))
    assert code == 0 and shown["state"] == "held" and shown["holder"]["outlives_process"] is True, shown
    code, r = cli_json("lease", "break", str(tmp_path), "--yes")
    assert code == 0 and r["result"] is not None, r
    [warning] = r["plan"]["warnings"]
    assert "found its lease taken over" in warning and "goes stale by itself" in warning, warning
    assert "still running" not in warning, warning
    assert not os.path.exists(os.path.join(root, LEASE_NAME))
    # its process still running here (its query or operation not stopped yet): broken, and the warning says so
    from checkpoint_ops.liveness import process_start

    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        running = Holder("a query's run", socket.gethostname(), alive.pid, process_start(alive.pid), "beef" * 8,
                         now - 60_000, int(time.time() * 1000), 600.0, "run", outlives_process=True)
        fm.write_bytes(os.path.join(root, LEASE_NAME), _record(running))
        code, r = cli_json("lease", "break", str(tmp_path), "--yes")
        assert code == 0 and f"pid {alive.pid} is still running on this host" in r["plan"]["warnings"][0], r
    finally:
        alive.kill()
        alive.wait()


# ---- the operation layer checks the leases before it writes anything ---------------------------------------


def test_an_operation_checks_held_leases_before_it_applies(tmp_path):
    """Leases a caller holds (a Dagster run's) are checked like the operation's own, and before the
    first write: a held lease not renewed for too long stops the operation with nothing changed."""
    target, other = tmp_path / "target", tmp_path / "held"
    target.mkdir(), other.mkdir()
    fm, root = open_file_manager(str(target))
    fm.write_bytes(os.path.join(root, LEASE_NAME), _record(_lapsed_holder("a lease to break")))
    held_fm, held_root = open_file_manager(str(other))
    held = LeaseSet([acquire(held_fm, held_root, "a run's lease", ttl_s=1.2, heartbeat=False)])
    try:
        time.sleep(1.1)
        before = sorted(os.listdir(target))
        with pytest.raises(LeaseLost, match="last renewed"):
            run(LeaseBreakOperation(str(target)), RunOptions(yes=True, held=held))
        assert sorted(os.listdir(target)) == before
    finally:
        held.release()


def test_release_removes_only_the_temp_files_of_lease_writes_that_died_before_the_lease(tmp_path):
    """A lease write killed mid-way leaves its hidden temp file; the next holder's release removes those
    older than its lease, and keeps a newer one (a writer still racing) and every other file of the root."""
    fm, root = open_file_manager(str(tmp_path))
    dead = tmp_path / f".{LEASE_NAME}.0b7e6a52-1c2d-4e5f-8a9b-0c1d2e3f4a5b.tmp"
    # the temp of its checksum sidecar (``..checkpoint-ops.lease.crc``), left by a kill between the two renames
    dead_crc = tmp_path / f"..{LEASE_NAME}.crc.1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f.tmp"
    racing = tmp_path / f".{LEASE_NAME}.9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a.tmp"
    spark_temp = tmp_path / ".12.3c2d1e0f-aaaa-4bbb-8ccc-dddddddddddd.tmp"
    for path in (dead, dead_crc, racing, spark_temp, tmp_path / "part-00000.parquet"):
        path.write_bytes(b"{")
    an_hour_ago, in_an_hour = time.time() - 3600, time.time() + 3600
    for path in (dead, dead_crc, spark_temp):
        os.utime(path, (an_hour_ago, an_hour_ago))
    os.utime(racing, (in_an_hour, in_an_hour))
    lease = acquire(fm, root, "A", ttl_s=30, heartbeat=False)
    lease.release()
    assert sorted(os.listdir(tmp_path)) == sorted([racing.name, spark_temp.name, "part-00000.parquet"])


def test_a_directory_where_the_lease_file_goes_is_named_with_what_to_do(tmp_path):
    """A directory ``.checkpoint-ops.lease`` (made by hand or by a copy tool) beside a checkpoint: every command
    said "storage error: Is a directory" with advice about credentials and endpoints (a hostile review). Each
    names it now, says to remove it, exits 2 and changes nothing; with it removed, they work."""
    from benchmarks.check_pass import INTERVAL, Stream

    s = Stream(str(tmp_path), retain=100)
    for _ in range(4):
        s.batch()
    lease_dir = os.path.join(s.ckpt, LEASE_NAME)
    os.mkdir(lease_dir)
    before = sorted(os.walk(s.ckpt))
    interval = ("--source-compact-interval", str(INTERVAL))
    for command in (("inspect", s.ckpt), ("fsck", s.ckpt), ("lease", "show", s.ckpt),
                    ("rollback", s.ckpt, "--to-batch", "1", "--yes", *interval)):
        code, r = cli_json(*command)
        assert code == 2, (command, r)
        assert r["path"].endswith(LEASE_NAME) and "is a directory" in r["problem"], (command, r)
        assert r["fix"].startswith("move that directory away"), (command, r)
    assert sorted(os.walk(s.ckpt)) == before
    with open(os.path.join(lease_dir, "notes.txt"), "w") as f:  # one that holds a file: the read-only ones too
        f.write("mine")
    for command in (("inspect", s.ckpt), ("fsck", s.ckpt)):
        code, r = cli_json(*command)
        assert code == 2 and r["path"].endswith(LEASE_NAME), (command, r)
    os.remove(os.path.join(lease_dir, "notes.txt"))
    os.rmdir(lease_dir)
    code, r = cli_json("rollback", s.ckpt, "--to-batch", "1", "--yes", *interval)
    assert code == 0, r
