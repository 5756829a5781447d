"""``resume`` and ``undo`` never act on a tree they did not leave: an operation stopped after it put ``metadata``
back (Spark may have run since), a checkpoint emptied after a rollback, files a store said it brought back but
did not. Fast tier: synthetic checkpoints in Spark's formats (benchmarks/synthetic.py), no Spark; the S3 cases
go through the fault proxy (tests/faulty_s3.py) in front of the moto server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import boto3
import pytest

from benchmarks import synthetic
from checkpoint_ops.lease import LEASE_NAME
from checkpoint_ops.liveness import Holder
from tests.faulty_s3 import FaultPlan
from tests.helpers import answer_at_prompt, cli, cli_json, is_lease_file, sigint_as_ctrl_c

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = b"CHECKPOINT-OPS-FENCE"
# batch 9 as a query started from the rollback's result writes it again: same names, other content
SPARKS_BATCH_9 = {
    "offsets/9": b'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1999999999999,"conf":{}}\n{"logOffset":9}',
    "commits/9": b'v1\n{"nextBatchWatermarkMs":0}',
    "sources/0/9.compact": b"v1\nNEW-BY-SPARK",
}


# ---- helpers ------------------------------------------------------------------------------------------------


def _s3(endpoint: str):
    return boto3.client("s3", endpoint_url=endpoint)


def _upload_checkpoint(endpoint: str, bucket: str, versioned: bool = False) -> str:
    s3 = _s3(endpoint)
    if versioned:
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    for rel, data in synthetic.files(batches=12, partitions=2, retain_state=13):
        s3.put_object(Bucket=bucket, Key=f"ckpt/{rel}", Body=data)
    return f"s3://{bucket}/ckpt"


def _objects(endpoint: str, bucket: str, prefix: str) -> dict[str, bytes]:
    s3, out = _s3(endpoint), {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            if not is_lease_file(o["Key"]):
                out[o["Key"]] = s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
    return out


def _cli(endpoint: str, *args: str) -> tuple[int, dict]:
    """``checkpoint-ops ... --json`` in a process of its own (a lease it could not release is then a dead
    process's, which the next command takes over)."""
    env = {k: v for k, v in os.environ.items() if k != "AWS_ENDPOINT_URL"}
    p = subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", *args, "--json", "--storage-options",
                        json.dumps({"endpoint_url": endpoint})], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=300)
    try:
        return p.returncode, json.loads(p.stdout)
    except ValueError:
        raise AssertionError(f"not JSON (exit {p.returncode}):\n{p.stdout}\n{p.stderr}") from None


def _rollback_stopped_after_unfencing(faulty_s3, s3_server, bucket, monkeypatch) -> tuple[str, dict]:
    """A rollback to batch 8 whose store fails right after it put ``metadata`` back (its 2nd plain PUT: the
    fence, then the unfence) and before its ``applied`` marker. Returns the URL and the error record."""
    url = _upload_checkpoint(s3_server, bucket)
    monkeypatch.setenv("CHECKPOINT_OPS_RETRY_ATTEMPTS", "3")
    faulty_s3.outage(3, after_requests=2, of_kind="PUT")
    code, err = _cli(faulty_s3.endpoint, "rollback", url, "--to-batch", "8", "--yes")
    faulty_s3.wait_outage_over()
    assert code == 2 and err["error"] == "StoreUnavailableError" and err["path"].endswith("/applied"), err
    meta = _s3(s3_server).get_object(Bucket=bucket, Key="ckpt/metadata")["Body"].read()
    assert not meta.startswith(FENCE), "the unfence did not happen: the test does not reach the window"
    return url, err


# ---- an operation stopped after it put metadata back ------------------------------------------------------


def test_a_rollback_stopped_after_its_unfence_says_spark_can_start_and_resume_only_records_it(
        faulty_s3, s3_server, bucket, monkeypatch):
    url, err = _rollback_stopped_after_unfencing(faulty_s3, s3_server, bucket, monkeypatch)
    assert "stays fenced" not in err["fix"] and "Spark cannot start" not in err["fix"], err["fix"]
    assert "put `metadata` back (Spark can start" in err["fix"] and f"checkpoint-ops resume {url}" in err["fix"]
    before = _objects(s3_server, bucket, "")
    code, out = _cli(faulty_s3.endpoint, "resume", url)
    assert code == 0 and out["result"]["status"] == "applied", out
    after = _objects(s3_server, bucket, "")
    journal = [k for k in after if k.endswith("/applied")]
    assert len(journal) == 1 and {k: v for k, v in after.items() if k not in journal} == before  # only the marker


def test_the_lease_warning_of_an_operation_stopped_by_the_store_gives_no_advice_of_its_own(
        faulty_s3, s3_server, bucket, monkeypatch):
    """The store fails right after the rollback put ``metadata`` back, and still fails when its lease is released:
    the release's warning said "nothing was changed; run the same command again" (the store failure's default
    advice) beside the error saying every change was made (a hostile review). It names the failure only."""
    url = _upload_checkpoint(s3_server, bucket)
    monkeypatch.setenv("CHECKPOINT_OPS_RETRY_ATTEMPTS", "3")
    faulty_s3.outage(3, after_requests=2, of_kind="PUT")
    env = {k: v for k, v in os.environ.items() if k != "AWS_ENDPOINT_URL"}
    p = subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", "rollback", url, "--to-batch", "8", "--yes",
                        "--storage-options", json.dumps({"endpoint_url": faulty_s3.endpoint})],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    faulty_s3.wait_outage_over()
    assert p.returncode == 2 and "checkpoint-ops resume" in p.stderr, p.stderr
    assert p.stderr.count("lease could not be released") == 1, p.stderr
    warning = p.stderr.split("lease could not be released", 1)[1].split("\ncheckpoint-ops:", 1)[0]  # its lines
    assert "nothing was changed" not in warning and "run the same command again" not in warning, warning


def test_resume_and_undo_refuse_once_the_query_ran_after_the_unfence(faulty_s3, s3_server, bucket, monkeypatch):
    url, _ = _rollback_stopped_after_unfencing(faulty_s3, s3_server, bucket, monkeypatch)
    s3 = _s3(s3_server)
    trash = [k for k in _objects(s3_server, bucket, ".checkpoint-ops/") if "/trash/" in k and k.endswith("/offsets/9")]
    assert len(trash) == 1
    original_offsets_9 = s3.get_object(Bucket=bucket, Key=trash[0])["Body"].read()
    for rel, data in SPARKS_BATCH_9.items():  # the query ran from the rollback's result
        s3.put_object(Bucket=bucket, Key=f"ckpt/{rel}", Body=data)
    before = _objects(s3_server, bucket, "")

    code, err = _cli(faulty_s3.endpoint, "resume", url)
    assert code == 1 and err["error"] == "RefusedError", err
    assert "offsets/9" in err["problem"] and "not fenced" in err["problem"] and "nothing was changed" in err["fix"]
    code, err = _cli(faulty_s3.endpoint, "undo", url, "--yes")
    assert code == 1 and err["error"] == "RefusedError" and "offsets/9" in err["problem"], err

    assert _objects(s3_server, bucket, "") == before  # Spark's batch 9 stays, the undo record holds the original
    assert s3.get_object(Bucket=bucket, Key=trash[0])["Body"].read() == original_offsets_9


# ---- undo on a checkpoint that is not the one the operation left --------------------------------------------


def _synthetic_sink(out: str, batches: int) -> None:
    os.makedirs(f"{out}/_spark_metadata", exist_ok=True)
    for b in range(batches):
        name = f"part-00000-{b:08d}-0000-0000-0000-000000000000-c000.json"
        data = f'{{"batch":{b}}}\n'.encode()
        with open(f"{out}/{name}", "wb") as f:
            f.write(data)
        entry = {"path": f"file://{out}/{name}", "size": len(data), "isDir": False,
                 "modificationTime": 1790000000000 + b * 1000 + 500, "blockReplication": 1, "blockSize": 33554432,
                 "action": "add"}
        with open(f"{out}/_spark_metadata/{b}", "w") as f:
            f.write("v1\n" + json.dumps(entry, separators=(",", ":")))


def _files(*roots: str) -> dict[str, bytes]:
    out = {}
    for root in roots:
        for d, _, names in os.walk(root):
            for n in names:
                path = os.path.join(d, n)
                if not is_lease_file(path):
                    with open(path, "rb") as f:
                        out[path] = f.read()
    return out


def _armed_cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    """The CLI in a child process with the kill switch set by ``env`` (checkpoint_ops/storage/killswitch.py)."""
    return subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env}, preexec_fn=sigint_as_ctrl_c)


def test_undo_of_a_copy_with_its_journal_is_refused_and_leaves_the_originals_undo_whole(tmp_path):
    """A checkpoint and its .checkpoint-ops directory copied (a rehearsal): `undo` of the copy put the files back
    into the copy, taking them out of the original's trash (the journal names it), so the original could no
    longer be undone (a hostile review). The journal records where its operation ran: elsewhere, undo (and resume,
    through the same ``executor.reopen``) is refused, naming that location, and nothing changes; the original's undo
    still works."""
    prod, copy = str(tmp_path / "prod"), str(tmp_path / "copy")
    synthetic.write_local(prod, batches=8, partitions=2, retain_state=7)
    code, r = cli_json("rollback", prod, "--to-batch", "3", "--yes")
    assert code == 0, r
    shutil.copytree(prod, copy)
    shutil.copytree(str(tmp_path / ".checkpoint-ops" / "prod"), str(tmp_path / ".checkpoint-ops" / "copy"))
    before = _files(str(tmp_path))
    code, refused = cli_json("undo", copy, "--yes")
    assert code == 2, refused
    assert f"records it at {prod}, not at {copy}" in refused["problem"], refused
    assert f"`checkpoint-ops undo {prod}`" in refused["fix"], refused
    assert _files(str(tmp_path)) == before
    code, r = cli_json("undo", prod, "--yes")
    assert code == 0 and r["result"]["status"] == "undone", r
    assert cli_json("fsck", prod)[0] == 0


def test_a_copy_of_a_fenced_checkpoint_is_refused_before_the_originals_lease_is_touched(tmp_path):
    """A rollback killed part-way (fenced, its dead lease left), its checkpoint and journal copied: `undo` and
    `resume` of the copy took over the original's stale lease (a write there) before refusing, and with a live one
    named `lease break` of the original (a second review). The location is judged first now: the original is left
    byte for byte, the fix says to finish it there and copy again, and the original then resumes."""
    template, prod, copy = str(tmp_path / "template"), str(tmp_path / "prod"), str(tmp_path / "copy")
    synthetic.write_local(template, batches=8, partitions=2, retain_state=7)
    steps = _traced_rollback(template, str(tmp_path / "traced"), str(tmp_path / "trace.txt"))
    fence = min(k for k, what in steps if what.endswith("/metadata"))
    shutil.copytree(template, prod)
    killed = _armed_cli(["rollback", prod, "--to-batch", "3", "--yes"], {"CHECKPOINT_OPS_KILL_AT": str(fence + 2)})
    assert killed.returncode == -9, killed.stderr
    shutil.copytree(prod, copy)
    shutil.copytree(str(tmp_path / ".checkpoint-ops" / "prod"), str(tmp_path / ".checkpoint-ops" / "copy"))
    original = {path: data for path, data in _all_files(prod).items()}  # its dead lease included
    for command in ("undo", "resume"):
        code, refused = cli_json(command, copy, "--yes")
        assert code == 2 and f"records it at {prod}, not at {copy}" in refused["problem"], refused
        assert "then copy the checkpoint again" in refused["fix"], refused
        assert _all_files(prod) == original
    code, r = cli_json("resume", prod, "--yes")
    assert code == 0, r
    assert cli_json("fsck", prod)[0] == 0


def test_a_rollback_after_one_killed_at_its_fence_write_can_be_undone(tmp_path):
    """A rollback killed as it wrote its fence leaves the fence's temp file (journaled, nothing changed). The next
    rollback planned that temp as litter to move aside, then dropped the killed one, temp included, before its
    journal: its undo record missed the file, and its undo was refused as incomplete (older code, found while
    testing the copy refusal). Settling now leaves a temp the new plan moves aside; the undo puts everything back."""
    template, ckpt = str(tmp_path / "template"), str(tmp_path / "ck")
    synthetic.write_local(template, batches=8, partitions=2, retain_state=7)
    steps = _traced_rollback(template, str(tmp_path / "traced"), str(tmp_path / "trace.txt"))
    fence = min(k for k, what in steps if what.endswith("/metadata"))
    shutil.copytree(template, ckpt)
    killed = _armed_cli(["rollback", ckpt, "--to-batch", "3", "--yes"], {"CHECKPOINT_OPS_KILL_AT": str(fence)})
    assert killed.returncode == -9, killed.stderr
    assert [n for n in os.listdir(ckpt) if n.startswith(".metadata.") and n.endswith(".tmp")]
    before = _files(ckpt)
    code, r = cli_json("rollback", ckpt, "--to-batch", "5", "--yes")
    assert code == 0, r
    code, r = cli_json("undo", ckpt, "--yes")
    assert code == 0 and r["result"]["status"] == "undone", r
    assert _files(ckpt) == before


def test_a_new_operation_on_a_copy_drops_a_copied_operation_that_never_started(tmp_path):
    """A rollback killed after its journal and ledger truncation, before its fence (it changed nothing), copied with
    its checkpoint: a new operation on the copy drops it, as on the original, with its truncation. Refusing the
    copied journal there (the copy refusal's first version) left the truncation, which hid batches 4..7 from the
    copy's ledger (a second review)."""
    template, prod, copy = str(tmp_path / "template"), str(tmp_path / "prod"), str(tmp_path / "copy")
    synthetic.write_local(template, batches=8, partitions=2, retain_state=7)
    steps = _traced_rollback(template, str(tmp_path / "traced"), str(tmp_path / "trace.txt"))
    fence = min(k for k, what in steps if what.endswith("/metadata"))
    shutil.copytree(template, prod)
    assert cli_json("ledger", "sync", prod)[0] == 0
    killed = _armed_cli(["rollback", prod, "--to-batch", "3", "--yes"], {"CHECKPOINT_OPS_KILL_AT": str(fence)})
    assert killed.returncode == -9, killed.stderr
    shutil.copytree(prod, copy)
    shutil.copytree(str(tmp_path / ".checkpoint-ops" / "prod"), str(tmp_path / ".checkpoint-ops" / "copy"))
    code, r = cli_json("rollback", copy, "--to-batch", "5", "--yes")
    assert code == 0, r
    code, r = cli_json("undo", copy, "--yes")
    assert code == 0, r
    code, shown = cli_json("ledger", "show", copy)
    assert code == 0 and shown["batches"] == {"first": 0, "last": 7, "count": 8}, shown["batches"]
    code, h = cli_json("history", copy)
    assert [op["status"] for op in h["operations"]] == ["abandoned", "undone"], h


def _all_files(root: str) -> dict[str, bytes]:
    """Every file under ``root``, the lease's included."""
    return {os.path.join(d, n): open(os.path.join(d, n), "rb").read() for d, _, names in os.walk(root) for n in names}


def _traced_rollback(template: str, traced: str, trace: str) -> list[tuple[int, str]]:
    """Roll a copy of ``template`` (at ``traced``) back to batch 3 with the kill switch armed but never firing, and
    return each mutating call it made: (its count k, the path it changed), for ``CHECKPOINT_OPS_KILL_AT=k``."""
    shutil.copytree(template, traced)
    done = _armed_cli(["rollback", traced, "--to-batch", "3", "--yes"],
                      {"CHECKPOINT_OPS_KILL_AT": "1000000", "CHECKPOINT_OPS_KILL_TRACE": trace})
    assert done.returncode == 0, done.stderr
    return [(int(k), what.rstrip()) for k, what in (line.split("\t", 1) for line in open(trace).read().splitlines())]


def test_undo_refuses_on_a_checkpoint_emptied_since_the_rollback(tmp_path):
    ckpt, out = str(tmp_path / "ck"), str(tmp_path / "out")
    synthetic.write_local(ckpt, batches=6, partitions=2, retain_state=5)
    _synthetic_sink(out, 6)
    code, r = cli_json("rollback", ckpt, "--to-batch", "2", "--sink", out, "--yes")
    assert code == 0, r
    for root in (ckpt, out):  # emptied (to restore into it, say), not removed: the journal beside it stays
        for name in os.listdir(root):
            path = os.path.join(root, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    ops = str(tmp_path / ".checkpoint-ops")
    before = _files(ckpt, out, ops)
    code, r = cli_json("undo", ckpt, "--yes")
    assert code == 1 and r["error"] == "RefusedError", r
    assert "`metadata` is missing" in r["problem"] and "not the one the rollback" in r["problem"], r
    assert r["path"].endswith("/metadata") and "restore a backup" in r["fix"]
    assert _files(ckpt, out, ops) == before  # no fragment of batches 3..5 written back


def test_undo_refuses_when_the_last_batch_the_rollback_left_is_gone(tmp_path):
    ckpt = str(tmp_path / "ck")
    synthetic.write_local(ckpt, batches=6, partitions=2, retain_state=5)
    code, r = cli_json("rollback", ckpt, "--to-batch", "2", "--yes")
    assert code == 0, r
    for rel in ("offsets/2", "offsets/.2.crc", "commits/2", "commits/.2.crc"):  # metadata kept, its last batch gone
        os.remove(os.path.join(ckpt, rel))
    before = _files(ckpt)
    code, r = cli_json("undo", ckpt, "--yes")
    assert code == 1 and "offsets/2 (the last batch the operation left) is missing" in r["problem"], r
    assert _files(ckpt) == before


def test_undo_after_the_query_ran_past_the_rollback_and_spark_purged_its_target_says_the_query_ran(tmp_path):
    """The query ran on after a rollback to batch 2 and Spark's cleanup (minBatchesToRetain) deleted batch 2's log
    files. Undo is refused (it would mix two timelines), and says so: "something wrote here after it (did the query
    run?)", not "the checkpoint is not the one the rollback left (emptied or replaced since?)" with the fix to
    restore a backup (a hostile review)."""
    ckpt = str(tmp_path / "ck")
    synthetic.write_local(ckpt, batches=6, partitions=2, retain_state=5)
    code, r = cli_json("rollback", ckpt, "--to-batch", "2", "--yes")
    assert code == 0, r
    for b in (3, 4, 5, 6):  # the query's batches after the rollback (as Spark writes them: each with its sidecar)
        for d, body in (("offsets", SPARKS_BATCH_9["offsets/9"]), ("commits", SPARKS_BATCH_9["commits/9"])):
            with open(os.path.join(ckpt, d, str(b)), "wb") as f:
                f.write(body)
    for rel in ("offsets/2", "offsets/.2.crc", "commits/2", "commits/.2.crc"):  # then its cleanup
        os.remove(os.path.join(ckpt, rel))
    before = _files(ckpt)
    code, r = cli_json("undo", ckpt, "--yes")
    assert code == 1 and "something wrote here after it (did the query run?)" in r["problem"], r
    assert "emptied or replaced" not in r["problem"] and "roll back to the batch you want" in r["fix"], r
    assert _files(ckpt) == before


# ---- undo says "undone" only with every file back ------------------------------------------------------------


def test_undo_is_never_marked_done_while_a_file_it_restored_is_still_missing(faulty_s3, s3_server, bucket):
    """Versioned bucket: the rollback's DeleteObjects is stored but its reply lost, so its retry adds a second
    delete marker per key; undo removes one. Whatever the store then does, undo either brings every file back
    and says so, or says which are missing and is not marked done."""
    url = _upload_checkpoint(s3_server, bucket, versioned=True)
    original = _objects(s3_server, bucket, "ckpt/")
    faulty_s3.set_plan(FaultPlan(rate=1.0, faults=("lost-reply",), requests=frozenset({"DELETE-MULTI"}), limit=1))
    code, r = _cli(faulty_s3.endpoint, "rollback", url, "--to-batch", "8", "--yes")
    assert code == 0, r
    faulty_s3.clear()
    code, r = _cli(faulty_s3.endpoint, "undo", url, "--yes")
    after = _objects(s3_server, bucket, "ckpt/")
    missing = sorted(k for k in original if k not in after)
    journal = [k for k in _objects(s3_server, bucket, ".checkpoint-ops/") if "/journal/" in k]
    if code == 0:
        assert r["result"]["status"] == "undone" and not missing, missing
    else:
        assert missing and r["error"] == "RefusedError", r
        assert "still missing" in r["problem"] and any(k.removeprefix("ckpt/") in r["problem"] for k in missing), r
        assert not [k for k in journal if k.endswith("/undone")], "marked undone with files missing"
        assert _s3(s3_server).get_object(Bucket=bucket, Key="ckpt/metadata")["Body"].read().startswith(FENCE)


def test_an_undo_stopped_after_its_unfence_is_recorded_by_undo_and_not_rolled_forward_over_new_batches(
        faulty_s3, s3_server, bucket, monkeypatch):
    url = _upload_checkpoint(s3_server, bucket)
    original = _objects(s3_server, bucket, "ckpt/")
    code, r = _cli(faulty_s3.endpoint, "rollback", url, "--to-batch", "8", "--yes")
    assert code == 0, r
    monkeypatch.setenv("CHECKPOINT_OPS_RETRY_ATTEMPTS", "3")
    faulty_s3.outage(3, after_requests=2, of_kind="PUT")  # the undo's fence, its unfence, then the store fails
    code, err = _cli(faulty_s3.endpoint, "undo", url, "--yes")
    faulty_s3.wait_outage_over()
    assert code == 2 and err["path"].endswith("/undone"), err
    assert _objects(s3_server, bucket, "ckpt/") == original  # every file and metadata back: Spark can start
    assert "stays fenced" not in err["fix"] and f"checkpoint-ops undo {url}" in err["fix"], err["fix"]
    s3 = _s3(s3_server)
    for rel, data in {"offsets/12": SPARKS_BATCH_9["offsets/9"], "commits/12": SPARKS_BATCH_9["commits/9"]}.items():
        s3.put_object(Bucket=bucket, Key=f"ckpt/{rel}", Body=data)  # the query ran on from batch 11
    before = _objects(s3_server, bucket, "")

    code, err = _cli(faulty_s3.endpoint, "resume", url)  # rolling the rollback forward would strand batch 12
    assert code == 1 and "offsets/12" in err["problem"] and "not fenced" in err["problem"], err
    assert _objects(s3_server, bucket, "") == before
    code, r = _cli(faulty_s3.endpoint, "undo", url, "--yes")  # only records what was done
    assert code == 0 and r["result"]["status"] == "undone", r
    after = _objects(s3_server, bucket, "")
    assert [k for k in after if k not in before] and all(k.endswith("/undone") for k in after if k not in before)
    assert {k: v for k, v in after.items() if k in before} == before


def _upload_sink_with_orphans(endpoint: str, bucket: str, batches: int, orphans: int) -> str:
    """A sink output on S3 (``out/``): one data file per batch, each in the sink log, and ``orphans`` data
    files no entry references."""
    s3 = _s3(endpoint)
    for b in range(batches):
        name = f"part-00000-{b:08d}-0000-0000-0000-000000000000-c000.json"
        data = f'{{"batch":{b}}}\n'.encode()
        s3.put_object(Bucket=bucket, Key=f"out/{name}", Body=data)
        entry = {"path": f"s3a://{bucket}/out/{name}", "size": len(data), "isDir": False,
                 "modificationTime": 1790000000000 + b * 1000, "blockReplication": 1, "blockSize": 33554432,
                 "action": "add"}
        s3.put_object(Bucket=bucket, Key=f"out/_spark_metadata/{b}",
                      Body=("v1\n" + json.dumps(entry, separators=(",", ":"))).encode())
    for i in range(orphans):
        s3.put_object(Bucket=bucket, Key=f"out/part-00000-{i:08d}-ffff-ffff-ffff-ffffffffffff-c000.json",
                      Body=f"orphan {i}".encode())
    return f"s3://{bucket}/out"


@pytest.mark.parametrize("how", ["--quarantine", "--delete"])
def test_an_orphan_cleanup_stopped_after_some_copies_is_finished_by_the_command_it_names(
        faulty_s3, s3_server, bucket, monkeypatch, how):
    """On S3 a move is a copy, then a delete. ``sink orphans`` (no checkpoint) stopped after 3 of its 6 copies
    (into the quarantine, or into the trash), before any delete: its message names ``resume``, and ``resume``
    finishes it (not "stopped before changing anything ... dropped", with the copies left behind without a
    record)."""
    out = _upload_sink_with_orphans(s3_server, bucket, batches=3, orphans=6)
    orphans = sorted(k for k in _objects(s3_server, bucket, "out/") if "ffff" in k)
    time.sleep(1.1)  # older than --min-age
    monkeypatch.setenv("CHECKPOINT_OPS_RETRY_ATTEMPTS", "3")
    faulty_s3.outage(5, after_requests=3, of_kind="COPY")  # three copies go through, then the store is down
    where = [how, f"s3://{bucket}/quarantine"] if how == "--quarantine" else [how]
    code, err = _cli(faulty_s3.endpoint, "sink", "orphans", out, "--min-age", "1s", *where, "--force", "--yes")
    faulty_s3.wait_outage_over()
    assert code == 2 and err["error"] == "StoreUnavailableError", err
    assert f"checkpoint-ops resume {out}" in err["fix"], err["fix"]
    copies = [k for k in _objects(s3_server, bucket, "") if "ffff" in k and not k.startswith("out/")]
    assert len(copies) == 3 and all(k in _objects(s3_server, bucket, "out/") for k in orphans), copies

    code, r = _cli(faulty_s3.endpoint, "resume", out)
    assert code == 0 and r["result"]["status"] == "applied", r
    left = _objects(s3_server, bucket, "out/")
    assert not [k for k in left if "ffff" in k] and len([k for k in left if k.startswith("out/part-")]) == 3
    moved = {k.rsplit("/", 1)[1]: v for k, v in _objects(s3_server, bucket, "").items()
             if "ffff" in k and not k.startswith("out/")}
    assert moved == {k.rsplit("/", 1)[1]: f"orphan {i}".encode() for i, k in enumerate(orphans)}


def test_a_resumed_rollback_never_replaces_what_its_undo_record_holds(tmp_path):
    """Killed part-way (fenced), then a file it had moved aside appears again with other content: resume
    refuses rather than move it over the original in the trash."""
    ckpt = str(tmp_path / "ck")
    synthetic.write_local(ckpt, batches=6, partitions=2, retain_state=5)
    env = {**os.environ, "CHECKPOINT_OPS_KILL_AT": "14"}  # fenced, commits/5 moved aside
    p = subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", "rollback", ckpt, "--to-batch", "2", "--yes"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == -9, p.stderr
    with open(os.path.join(ckpt, "metadata"), "rb") as f:
        assert f.read().startswith(FENCE)
    trash = next(os.path.join(d, n) for d, _, names in os.walk(str(tmp_path / ".checkpoint-ops")) for n in names
                 if "/trash/" in d and not n.startswith("."))
    rel = trash.split("/trash/", 1)[1].split("/", 1)[1]
    with open(os.path.join(ckpt, rel), "wb") as f:
        f.write(b"v1\nwritten while the checkpoint was fenced")
    before = _files(ckpt, str(tmp_path / ".checkpoint-ops"))
    code, r = cli_json("resume", ckpt)
    assert code == 1 and r["error"] == "RefusedError" and "undo record" in r["problem"] and rel in r["problem"], r
    assert _files(ckpt, str(tmp_path / ".checkpoint-ops")) == before


def test_an_operation_killed_before_its_fence_is_dropped_when_the_command_runs_again(tmp_path):
    """Killed between its journal and its fence (nothing changed; fsck shows at most a temp file), a rollback
    is simply run again, as a user would. The first one is then dropped (``abandoned``), with the temp file
    of the write it died in: left ``unfinished`` under the newer one, neither ``resume`` nor ``undo`` (they act
    on the newest) nor ``prune`` (it keeps unfinished ones) could ever end it (a hostile review's dead end)."""
    ckpt, out = str(tmp_path / "ck"), str(tmp_path / "out")
    pristine = str(tmp_path / "pristine")
    synthetic.write_local(pristine, batches=6, partitions=2, retain_state=5)
    rollback = ["rollback", ckpt, "--to-batch", "2", "--sink", out, "--yes"]
    for kill_at in range(1, 40):  # the first count at which the killed rollback journaled and fenced nothing yet
        for d in (ckpt, out, str(tmp_path / ".checkpoint-ops")):
            shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(pristine, ckpt)
        _synthetic_sink(out, 6)
        clean = _files(ckpt, out)
        killed = subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", *rollback], cwd=ROOT,
                                env={**os.environ, "CHECKPOINT_OPS_KILL_AT": str(kill_at)}, capture_output=True)
        assert killed.returncode == -9, killed.stderr[-2000:]
        code, h = cli_json("history", ckpt)
        if h["operations"] and not open(os.path.join(ckpt, "metadata"), "rb").read().startswith(FENCE):
            break
    else:
        raise AssertionError("no killed rollback stopped between its journal and its fence")
    code, h = cli_json("history", ckpt)
    (first,) = h["operations"]
    assert first["status"] == "unfinished", h
    assert {p: d for p, d in _files(ckpt, out).items() if "/." not in p} == \
        {p: d for p, d in clean.items() if "/." not in p}  # nothing changed but hidden temp files

    code, r = cli_json(*rollback)  # run again
    assert code == 0 and r["result"]["status"] == "applied", r
    code, h = cli_json("history", ckpt)
    assert [op["status"] for op in h["operations"]] == ["abandoned", "applied"], h
    code, f = cli_json("fsck", ckpt, "--sink", out)
    assert (code, f["findings"]) == (0, []), f  # the temp file of the killed write is gone with it
    code, p = cli_json("prune", ckpt, "--keep-last", "0", "--dry-run")
    assert code == 0 and "unfinished" not in json.dumps(p), p
    code, u = cli_json("undo", ckpt, "--yes")  # undoes the second, the one that applied
    assert code == 0, u


def test_a_damaged_earlier_journal_does_not_stop_a_new_operation(tmp_path):
    """Before journaling, a new operation drops earlier ones that changed nothing; a journal it cannot read
    (damaged by hand or by the disk) is left as it is for resume and undo to name, and the new one goes on."""
    ckpt, out = str(tmp_path / "ck"), str(tmp_path / "out")
    synthetic.write_local(ckpt, batches=6, partitions=2, retain_state=5)
    _synthetic_sink(out, 6)
    damaged = tmp_path / ".checkpoint-ops" / "ck" / "journal" / "20200101T000000.000000Z-rollback-00000000"
    damaged.mkdir(parents=True)
    (damaged / "plan.json").write_bytes(b'{"format": 1, "op_')
    code, r = cli_json("rollback", ckpt, "--to-batch", "2", "--sink", out, "--yes")
    assert code == 0 and r["result"]["status"] == "applied", r
    assert (damaged / "plan.json").read_bytes() == b'{"format": 1, "op_' and os.listdir(damaged) == ["plan.json"]


def test_resume_after_a_kill_inside_the_unfence_leaves_no_temp_file(tmp_path):
    """Killed inside the unfence, after ``metadata`` was put back and while its checksum sidecar was written (a
    hostile review's SIGKILLs: about 1 in 260), a rollback leaves ``..metadata.crc.<uuid>.tmp`` and no sidecar.
    ``resume`` records the operation and writes the sidecar; the temp file goes too, so fsck is clean."""
    ckpt, out = str(tmp_path / "ck"), str(tmp_path / "out")
    synthetic.write_local(ckpt, batches=6, partitions=2, retain_state=5)
    _synthetic_sink(out, 6)
    code, r = cli_json("rollback", ckpt, "--to-batch", "2", "--sink", out, "--yes")
    assert code == 0 and r["result"]["status"] == "applied", r
    # the state such a kill leaves: every change made, metadata back, its sidecar half-written, no marker
    (journal,) = [d for d, _, names in os.walk(str(tmp_path / ".checkpoint-ops")) if "applied" in names]
    os.remove(os.path.join(journal, "applied"))
    crc = os.path.join(ckpt, ".metadata.crc")
    partial = open(crc, "rb").read()[:6]
    os.remove(crc)
    temp = os.path.join(ckpt, "..metadata.crc.0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b.tmp")
    with open(temp, "wb") as f:
        f.write(partial)
    code, f = cli_json("fsck", ckpt, "--sink", out)
    assert code == 1 and any(os.path.basename(temp) in json.dumps(x) for x in f["findings"]), f

    code, r = cli_json("resume", ckpt)
    assert code == 0 and r["result"]["status"] == "applied", r
    assert not os.path.exists(temp) and os.path.exists(crc)
    code, f = cli_json("fsck", ckpt, "--sink", out)
    assert (code, f["findings"]) == (0, []), f


def test_undo_after_a_command_killed_before_it_journaled_names_the_older_operation_and_changes_nothing(tmp_path):
    """A rollback killed while it planned (its lease taken, nothing journaled) changed nothing. ``undo`` asked
    for the newest operation then reverted the one before it (a hostile review: a restore, whose undo removed the
    whole checkpoint and its output). It now refuses, naming that older operation and how to name it, changes
    nothing (the dead command's lease included: the same undo refuses again); ``--op`` undoes it, and running the
    stopped command again ends the refusal."""
    ckpt, out = str(tmp_path / "ck"), str(tmp_path / "out")
    pristine, before_first = str(tmp_path / "pristine"), None
    synthetic.write_local(pristine, batches=6, partitions=2, retain_state=5)
    second = ["rollback", ckpt, "--to-batch", "2", "--sink", out, "--yes"]
    for kill_at in range(1, 40):  # the first count at which the killed rollback holds its lease, journaled nothing
        for d in (ckpt, out, str(tmp_path / ".checkpoint-ops")):
            shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(pristine, ckpt)
        _synthetic_sink(out, 6)
        before_first = _files(ckpt, out)
        code, first = cli_json("rollback", ckpt, "--to-batch", "4", "--sink", out, "--yes")
        assert code == 0 and first["result"]["status"] == "applied", first
        killed = subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", *second], cwd=ROOT,
                                env={**os.environ, "CHECKPOINT_OPS_KILL_AT": str(kill_at)}, capture_output=True)
        assert killed.returncode == -9, killed.stderr[-2000:]
        code, h = cli_json("history", ckpt)
        if len(h["operations"]) > 1:
            raise AssertionError(f"no kill between the second rollback's lease and its journal (k={kill_at}): {h}")
        if os.path.exists(os.path.join(ckpt, ".checkpoint-ops.lease")):  # published (not only its temp file)
            break
    else:
        raise AssertionError("no killed rollback left its lease")
    first_id = first["result"]["op_id"]
    after_kill = _files(ckpt, out)
    lease = sorted(n for n in os.listdir(ckpt) if is_lease_file(n))

    for _ in range(2):  # refused, and refused again: nothing, the dead command's lease included, was changed
        code, u = cli_json("undo", ckpt, "--yes")
        assert code == 1 and u["error"] == "RefusedError", u
        assert "checkpoint-ops rollback" in u["problem"] and first_id in u["problem"], u
        assert f"--op {first_id}" in u["fix"], u
        assert _files(ckpt, out) == after_kill
        assert sorted(n for n in os.listdir(ckpt) if is_lease_file(n)) == lease

    code, u = cli_json("undo", ckpt, "--op", first_id, "--yes")  # named: undone, byte for byte
    assert code == 0 and u["result"]["status"] == "undone", u
    assert {p: d for p, d in _files(ckpt, out).items() if "/." not in p} == \
        {p: d for p, d in before_first.items() if "/." not in p}


def test_resume_after_a_command_killed_before_it_journaled_keeps_the_lease_that_stops_undo(tmp_path):
    """A rollback died holding the lease before it journaled (its record as a killed rollback leaves it), after an
    operation that finished. ``resume``, the natural next step after a crash, said "nothing to resume" but took the
    dead holder's lease over and released it, so the ``undo`` run next no longer refused and reverted the older
    operation (a hostile review: a restore, whose undo emptied the checkpoint on S3). ``resume`` now says that the
    stopped command changed nothing, names the older operation, and leaves the lease as it was: undo still
    refuses."""
    ckpt, out = str(tmp_path / "ck"), str(tmp_path / "out")
    synthetic.write_local(ckpt, batches=6, partitions=2, retain_state=5)
    _synthetic_sink(out, 6)
    code, first = cli_json("rollback", ckpt, "--to-batch", "4", "--sink", out, "--yes")
    assert code == 0, first
    first_id = first["result"]["op_id"]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    holder = Holder(**{**Holder.me("checkpoint-ops rollback (user x)", kind="operation",
                                   operation="rollback").to_dict(), "pid": int(dead.stdout), "pid_start": None})
    lease = os.path.join(ckpt, ".checkpoint-ops.lease")
    with open(lease, "w") as f:
        json.dump(holder.to_dict(), f)
    before = _files(ckpt, out)
    for _ in range(2):
        code, r = cli_json("resume", ckpt)
        assert code == 1 and r["problem"].startswith("nothing to resume: the last command"), r
        assert "checkpoint-ops rollback" in r["problem"] and first_id in r["problem"], r
        assert f"--op {first_id}" in r["fix"] and "run it again" in r["fix"], r
        assert _files(ckpt, out) == before and os.path.exists(lease)
    code, u = cli_json("undo", ckpt, "--yes")
    assert code == 1 and first_id in u["problem"] and "was stopped" in u["problem"], u
    assert _files(ckpt, out) == before


def test_an_undo_killed_after_it_finished_is_not_followed_by_an_undo_of_the_operation_before(tmp_path):
    """Rollback X, rollback Y, then an undo of Y killed after it had marked Y undone, while it released its lease
    (a second review: kill points 25 and 30 of 30). Running undo again, as its help says for an interrupted undo,
    reverted X too, without a word; ``resume`` first cleared the lease, with the same result. Both now refuse,
    saying the stopped undo had finished, and leave everything (the lease included); ``--op`` reverts X. An undo
    killed part-way (any earlier kill point) is still finished by running undo again."""
    def scenario(name: str) -> tuple[str, str]:
        """A checkpoint rolled back to 5 (X), then to 3 (Y): its path and X's op id."""
        ckpt = str(tmp_path / name)
        synthetic.write_local(ckpt, batches=8, partitions=2, retain_state=7)
        ids = []
        for batch in ("5", "3"):
            code, r = cli_json("rollback", ckpt, "--to-batch", batch, "--yes")
            assert code == 0, r
            ids.append(r["result"]["op_id"])
        return ckpt, ids[0]

    traced, _ = scenario("traced")
    trace = str(tmp_path / "trace.txt")
    done = _armed_cli(["undo", traced, "--yes"], {"CHECKPOINT_OPS_KILL_AT": "1000000", "CHECKPOINT_OPS_KILL_TRACE": trace})
    assert done.returncode == 0, done.stderr
    total = len(open(trace).read().splitlines())
    # the last kill point: Y is marked undone, the lease not yet released
    ckpt, x_id = scenario("last")
    killed = _armed_cli(["undo", ckpt, "--yes"], {"CHECKPOINT_OPS_KILL_AT": str(total)})
    assert killed.returncode == -9, killed.stderr
    code, h = cli_json("history", ckpt)
    assert [op["status"] for op in h["operations"]] == ["applied", "undone"], h  # Y undone
    assert any(is_lease_file(n) for n in os.listdir(ckpt)), "the killed undo left no lease"
    before = _files(ckpt)
    for command in (["resume", ckpt], ["undo", ckpt, "--yes"], ["undo", ckpt, "--yes"]):
        code, r = cli_json(*command)
        assert code == 1 and "had finished its undo" in r["problem"] and x_id in r["problem"], (command, r)
        assert f"--op {x_id}" in r["fix"] and "run it again" not in r["fix"], r  # not round in a circle
        assert _files(ckpt) == before
    code, r = cli_json("undo", ckpt, "--op", x_id, "--yes")
    assert code == 0 and r["result"]["op_id"] == x_id, r
    # a kill part-way: undo run again finishes the undo of Y, as before
    ckpt, x_id = scenario("middle")
    killed = _armed_cli(["undo", ckpt, "--yes"], {"CHECKPOINT_OPS_KILL_AT": str(total // 2)})
    assert killed.returncode == -9, killed.stderr
    code, r = cli_json("undo", ckpt, "--yes")
    assert code == 0 and r["result"]["op_id"] != x_id, r
    code, h = cli_json("history", ckpt)
    assert [op["status"] for op in h["operations"]] == ["applied", "undone"], h


def test_running_the_killed_command_again_ends_the_undo_refusal(tmp_path):
    """After a command died holding the lease (here: a dead holder's record written as a killed rollback leaves
    it), running that command again takes the lease over and journals; ``undo`` then reverts it, as asked."""
    ckpt, out = str(tmp_path / "ck"), str(tmp_path / "out")
    synthetic.write_local(ckpt, batches=6, partitions=2, retain_state=5)
    _synthetic_sink(out, 6)
    code, first = cli_json("rollback", ckpt, "--to-batch", "4", "--sink", out, "--yes")
    assert code == 0, first
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)

    def died_holding(operation: str | None, kind: str = "operation") -> None:
        holder = Holder(**{**Holder.me(f"checkpoint-ops {operation} (user x)", kind=kind,
                                       operation=operation).to_dict(), "pid": int(dead.stdout), "pid_start": None})
        with open(os.path.join(ckpt, ".checkpoint-ops.lease"), "w") as f:
            json.dump(holder.to_dict(), f)

    # nothing of a prune or a ledger sync is undone, and a dead Dagster run (run again, it would process new input)
    # is not known to have been rolling back: undo means the rollback, as it says (a second review's false refusals)
    for operation, kind in (("prune", "operation"), (None, "operation"), (None, "run")):
        died_holding(operation, kind)
        code, u = cli_json("undo", ckpt, "--dry-run")
        assert code == 0 and u["plan"]["summary"]["undo"].startswith(f"rollback {first['result']['op_id']}"), u
    died_holding("rollback")
    code, u = cli_json("undo", ckpt, "--dry-run")  # a dry run is refused alike: it would plan the older one
    assert code == 1 and first["result"]["op_id"] in u["problem"], u
    from checkpoint_ops.errors import RefusedError, parameter_names
    from checkpoint_ops.operation import RunOptions, run
    from checkpoint_ops.recovery import UndoOperation
    from dagster_checkpoint_ops.operations import UNDO_NAMES

    with parameter_names(UNDO_NAMES), pytest.raises(RefusedError) as refused:  # as the Dagster undo job runs it
        run(UndoOperation(ckpt), RunOptions(dry_run=True))
    assert f"(op_id {first['result']['op_id']})" in refused.value.fix, refused.value.fix  # its key, not --op
    code, second = cli_json("rollback", ckpt, "--to-batch", "2", "--sink", out, "--yes")
    assert code == 0 and second["result"]["status"] == "applied", second
    code, u = cli_json("undo", ckpt, "--yes")
    assert code == 0 and u["result"]["op_id"] == second["result"]["op_id"], u


def test_a_rollback_stopped_with_ctrl_c_before_it_applied_says_there_is_nothing_to_undo(tmp_path):
    """Ctrl-C at the confirmation prompt (or while planning) releases the lease, so nothing is left for undo to see,
    and the message said "`checkpoint-ops undo PATH` reverts it": undo then reverted the operation before it (a
    hostile review: a restore, which emptied the checkpoint). The message now says the rollback changed nothing and
    that undo would revert the operation before it; nothing was changed."""
    ckpt, out = str(tmp_path / "ck"), str(tmp_path / "out")
    synthetic.write_local(ckpt, batches=6, partitions=2, retain_state=5)
    _synthetic_sink(out, 6)
    code, first = cli_json("rollback", ckpt, "--to-batch", "4", "--sink", out, "--yes")
    assert code == 0, first
    before = _files(ckpt, out)
    code, text = answer_at_prompt(["rollback", ckpt, "--to-batch", "2", "--sink", out], b"\x03")  # Ctrl-C at it
    assert code == 130, text[-2000:]
    assert "the rollback stopped before it changed anything" in text and "nothing of it to resume or undo" in text, \
        text[-2000:]
    assert "`checkpoint-ops undo PATH` reverts it" not in text
    assert _files(ckpt, out) == before
    code, h = cli_json("history", ckpt)
    assert [op["status"] for op in h["operations"]] == ["applied"], h


def test_an_undo_stopped_with_ctrl_c_at_its_prompt_says_the_interrupted_rollback_stays_fenced(tmp_path):
    """Ctrl-C at an undo's prompt, on a checkpoint an interrupted rollback fenced: the message said "there is nothing
    of it to resume or undo (`undo` would revert the operation before it)", though the fence is still there and undo
    is exactly what was asked (a hostile review). It now says the operation it acts on is as it was, still fenced, and
    to run the undo again; nothing changed, and that undo then works."""
    ckpt = str(tmp_path / "ck")
    synthetic.write_local(ckpt, batches=8, partitions=2, retain_state=7)
    steps = _traced_rollback(ckpt, str(tmp_path / "traced"), str(tmp_path / "trace.txt"))
    fence = min(k for k, what in steps if what.endswith("/metadata"))  # the apply's first change
    killed = _armed_cli(["rollback", ckpt, "--to-batch", "3", "--yes"], {"CHECKPOINT_OPS_KILL_AT": str(fence + 2)})
    assert killed.returncode == -9, killed.stderr  # SIGKILL part-way through the apply: fenced
    assert b"checkpoint-ops" in open(os.path.join(ckpt, "metadata"), "rb").read()
    before = _files(ckpt)
    code, text = answer_at_prompt(["undo", ckpt], b"\x03")
    assert code == 130, text[-2000:]
    assert f"{ckpt}: interrupted: the undo stopped before it changed anything; the operation it acts on is as it " \
        "was (a checkpoint that operation fenced stays fenced)" in text, text[-2000:]
    assert f"run `checkpoint-ops undo {ckpt}` again to apply it" in text, text[-2000:]
    assert "nothing of it to resume or undo" not in text
    assert _files(ckpt) == before
    code, r = cli_json("undo", ckpt, "--yes")
    assert code == 0, r
    assert cli_json("fsck", ckpt)[0] == 0


def test_a_rollback_stopped_with_ctrl_c_while_applying_names_resume_and_undo(tmp_path):
    """Ctrl-C while the rollback applies its plan: it printed only "interrupted" and "if it was changing something,
    resume or undo PATH", though the docs said the command says whether it changed anything. It now names the
    operation and the checkpoint, says it may have changed files, and gives both commands with the path; the
    resume it names finishes it."""
    ckpt = str(tmp_path / "ck")
    synthetic.write_local(ckpt, batches=40, partitions=100, retain_state=39)
    proc = subprocess.Popen([sys.executable, "-m", "checkpoint_ops.cli", "rollback", ckpt, "--to-batch", "2", "--yes"],
                            preexec_fn=sigint_as_ctrl_c,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:  # the fence is the first change the apply makes
        try:
            if b"checkpoint-ops" in open(os.path.join(ckpt, "metadata"), "rb").read():
                break
        except OSError:
            pass
        time.sleep(0.002)
    proc.send_signal(2)  # SIGINT, as Ctrl-C sends
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    assert f"{ckpt}: interrupted: the rollback stopped while applying its plan" in err, err
    assert f"`checkpoint-ops resume {ckpt}` finishes it" in err and f"`checkpoint-ops undo {ckpt}` reverts it" in err
    code, r = cli_json("resume", ckpt)
    assert code == 0, r
    assert cli_json("fsck", ckpt)[0] == 0


@pytest.mark.parametrize("json_output", [True, False], ids=["json", "text"])
def test_ctrl_c_while_a_finished_rollback_releases_its_lease_releases_it_and_says_it_finished(tmp_path, json_output):
    """Ctrl-C once the rollback had applied its whole plan, as its lease was released (a hostile review): the
    interrupt stopped the release, so the lease was left, no output was shown, and the message was the generic one
    ("if it was changing something, resume or undo PATH"). Now the release finishes first, what the rollback did is
    shown (the whole --json document), and the message says it finished and that there is nothing to resume. The
    SIGINT is real, sent by the kill switch as the lease's record is about to be deleted."""
    template = str(tmp_path / "template")
    synthetic.write_local(template, batches=8, partitions=2, retain_state=7)
    args = ["--json"] if json_output else []

    traced = str(tmp_path / "traced")
    steps = _traced_rollback(template, traced, str(tmp_path / "trace.txt"))
    release = [k for k, what in steps if what.endswith(LEASE_NAME)]
    assert release, steps[-5:]  # the lease's record is deleted through the file manager, as every change is

    ckpt = str(tmp_path / "ck")
    shutil.copytree(template, ckpt)
    stopped = _armed_cli(["rollback", ckpt, "--to-batch", "3", "--yes", *args],
                         {"CHECKPOINT_OPS_KILL_AT": str(release[-1]), "CHECKPOINT_OPS_KILL_SIGNAL": "INT"})
    # exit 0: the interrupt stopped nothing (130 made a wrapper that retries on failure run the operation again)
    assert stopped.returncode == 0, (stopped.stdout, stopped.stderr)
    assert f"{ckpt}: interrupted after the rollback finished: it had applied its whole plan" in stopped.stderr, \
        stopped.stderr
    assert "interrupted: releasing the lease(s) first (Ctrl-C again to stop at once" in stopped.stderr
    assert f"nothing is left to resume; `checkpoint-ops undo {ckpt}` reverts it (`checkpoint-ops history {ckpt}` " \
        "lists it)" in stopped.stderr, stopped.stderr
    if json_output:
        shown = json.loads(stopped.stdout)
        assert shown["operation"] == "rollback" and shown["result"]["status"] == "applied", shown
    else:
        assert "last committed batch is now 3" in stopped.stdout, stopped.stdout
    assert not [n for n in os.listdir(ckpt) if is_lease_file(n)], os.listdir(ckpt)  # released, not left
    code, h = cli_json("history", ckpt)
    assert [op["status"] for op in h["operations"]] == ["applied"], h
    assert cli_json("fsck", ckpt)[0] == 0
    def relative(root: str) -> dict[str, bytes]:
        return {os.path.relpath(path, root): data for path, data in _files(root).items()}

    assert relative(ckpt) == relative(traced)  # what the uninterrupted rollback left, file for file


def test_ctrl_c_once_the_journal_says_applied_says_the_rollback_finished(tmp_path):
    """Ctrl-C after the journal's `applied` marker was written, before the apply returned (its checksum sidecar, the
    last of the apply's own writes): the message said "stopped while applying its plan, and may have changed files"
    with resume and undo, though `resume` then answers there is nothing to resume (a hostile review). It now says
    the rollback finished and its output was not shown; the lease is released. A Ctrl-C as the marker itself is
    written still says it may have changed files."""
    template = str(tmp_path / "template")
    synthetic.write_local(template, batches=8, partitions=2, retain_state=7)
    steps = _traced_rollback(template, str(tmp_path / "traced"), str(tmp_path / "trace.txt"))
    (marker,) = [k for k, what in steps if what.endswith("/applied")]

    for k, finished in ((marker + 1, True), (marker, False)):
        ckpt = str(tmp_path / f"ck{k}")
        shutil.copytree(template, ckpt)
        stopped = _armed_cli(["rollback", ckpt, "--to-batch", "3", "--yes"],
                             {"CHECKPOINT_OPS_KILL_AT": str(k), "CHECKPOINT_OPS_KILL_SIGNAL": "INT"})
        assert stopped.returncode == 130, stopped.stderr
        assert not [n for n in os.listdir(ckpt) if is_lease_file(n)], os.listdir(ckpt)
        if finished:
            assert f"{ckpt}: interrupted after the rollback finished: it had applied its whole plan; its output was " \
                "not shown" in stopped.stderr, stopped.stderr
            assert "may have changed files" not in stopped.stderr
            code, h = cli_json("history", ckpt)
            assert [op["status"] for op in h["operations"]] == ["applied"], h
        else:
            assert f"{ckpt}: interrupted: the rollback stopped while applying its plan" in stopped.stderr, stopped.stderr
            code, r = cli_json("resume", ckpt, "--yes")
            assert code == 0, r
        assert cli_json("fsck", ckpt)[0] == 0


def test_ctrl_c_during_an_apply_names_where_resume_and_undo_find_the_journal(tmp_path):
    """A sink operation given its checkpoint is journaled at the checkpoint (the anchor), not at the output it
    leases first: that is the path the Ctrl-C message names."""
    from checkpoint_ops.rollback import RollbackOperation
    from checkpoint_ops.sinklog import SinkCompactOperation

    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ck")
    assert SinkCompactOperation(out, ckpt).recovery_url() == ckpt
    assert SinkCompactOperation(out).recovery_url() == out
    assert RollbackOperation(ckpt, to_batch=1, sink_urls=[out]).recovery_url() == ckpt


def test_ctrl_c_before_the_journal_is_told_apart_from_ctrl_c_after_it(tmp_path):
    """Ctrl-C during an apply advises resume or undo only once the operation journaled: before (a sink operation's
    ledger sync runs first), undo would revert the operation before it (hostile review: it reverted a rollback)."""
    import time as clock

    from checkpoint_ops.operation import _journaled_since

    ckpt = str(tmp_path / "ck")
    synthetic.write_local(ckpt, batches=6, partitions=1, retain_state=5)
    code, first = cli_json("rollback", ckpt, "--to-batch", "4", "--yes")
    assert code == 0, first
    now = clock.time()
    assert not _journaled_since(ckpt, now, None)  # only the rollback before: not this command's
    code, second = cli_json("rollback", ckpt, "--to-batch", "3", "--yes")
    assert code == 0, second
    assert _journaled_since(ckpt, now, None)


def test_ctrl_c_while_the_lease_is_taken_leaves_no_lease_and_no_temp_file(tmp_path):
    """Ctrl-C as the lease's record is published, or its checksum sidecar written after it: the lease was left
    (other hosts waited for it to go stale) and the message said the rollback stopped before it changed anything;
    before the publish, the record's temp file was left. Now the first Ctrl-C is held until the lease is taken, then
    it is released: nothing of the command is left, and the message is true."""
    template = str(tmp_path / "template")
    synthetic.write_local(template, batches=8, partitions=2, retain_state=7)
    steps = _traced_rollback(template, str(tmp_path / "traced"), str(tmp_path / "trace.txt"))
    taking = [k for k, what in steps if is_lease_file(what)][:2]  # the lease's record, then its sidecar
    assert len(taking) == 2 and taking[0] == 1, steps[:4]
    for k in taking:
        ckpt = str(tmp_path / f"ck{k}")
        shutil.copytree(template, ckpt)
        before = _files(ckpt)
        stopped = _armed_cli(["rollback", ckpt, "--to-batch", "3", "--yes"],
                             {"CHECKPOINT_OPS_KILL_AT": str(k), "CHECKPOINT_OPS_KILL_SIGNAL": "INT"})
        assert stopped.returncode == 130, (stopped.stdout, stopped.stderr)
        assert sorted(os.listdir(ckpt)) == sorted(os.listdir(template)), os.listdir(ckpt)  # no lease, no temp
        assert "interrupted: finishing the lease being taken, then releasing it" in stopped.stderr, stopped.stderr
        assert "the rollback stopped before it changed anything" in stopped.stderr, stopped.stderr
        assert _files(ckpt) == before
        code, r = cli_json("rollback", ckpt, "--to-batch", "3", "--yes")  # not in use: it runs at once
        assert code == 0, r


def test_a_copy_made_while_fenced_is_told_to_finish_the_operation_where_it_ran(tmp_path):
    """A checkpoint copied with its .checkpoint-ops directory while a rollback had it fenced: fsck and rollback on the
    copy advised `resume`/`undo` of the copy, which refuse a journal of another location, so the advice went one step
    round before it ended. They now name the location the rollback ran at, from the fence's journal, and say to
    finish it there and copy again; the original's own advice is unchanged."""
    template = str(tmp_path / "template")
    synthetic.write_local(template, batches=8, partitions=2, retain_state=7)
    steps = _traced_rollback(template, str(tmp_path / "traced"), str(tmp_path / "trace.txt"))
    fenced_at = [k for k, what in steps if what.endswith("/metadata")][0]
    prod, copy = str(tmp_path / "prod"), str(tmp_path / "copy")
    shutil.copytree(template, prod)
    killed = _armed_cli(["rollback", prod, "--to-batch", "3", "--yes"], {"CHECKPOINT_OPS_KILL_AT": str(fenced_at + 1)})
    assert killed.returncode == -9, killed.stderr
    shutil.copytree(prod, copy)
    shutil.copytree(str(tmp_path / ".checkpoint-ops" / "prod"), str(tmp_path / ".checkpoint-ops" / "copy"))

    code, report = cli_json("fsck", copy)
    (finding,) = [f for f in report["findings"] if f["code"] == "operation-interrupted"]
    assert f"this checkpoint was copied (or moved) from {prod} while a rollback there had it fenced" in finding["fix"]
    assert f"`checkpoint-ops resume {prod}`" in finding["fix"] and f"`checkpoint-ops undo {prod}`" in finding["fix"]
    assert f"resume {copy}" not in finding["fix"], finding
    code, r = cli_json("rollback", copy, "--to-batch", "2", "--yes")
    assert code == 1 and f"copied (or moved) from {prod}" in r["fix"], r
    code, r = cli_json("inspect", copy)  # inspect's FENCED line too (it advised the copy's own resume)
    assert f"copied (or moved) from {prod}" in r["fenced"]["fix"], r["fenced"]
    code, out, _ = cli("inspect", copy)
    assert f"`checkpoint-ops resume {prod}`" in out, out

    code, report = cli_json("fsck", prod)  # the original: finish it here
    (finding,) = [f for f in report["findings"] if f["code"] == "operation-interrupted"]
    assert f"`checkpoint-ops resume {prod}`" in finding["fix"] and "copied" not in finding["fix"], finding
    code, r = cli_json("resume", prod, "--yes")
    assert code == 0, r
