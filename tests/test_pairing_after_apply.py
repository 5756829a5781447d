"""A journaled operation on a checkpoint and its sink records their pairing once it is applied. A store that
fails at that point stops the command as any store failure does (exit 2), but the message must say that
the operation was applied and only the pairing record was not written, and how to write it: never "nothing
was changed" while ``history`` shows it applied. Through the fault proxy (tests/faulty_s3.py): an outage
that starts right after the operation's last conditional write (its journal's ``applied`` marker), counted
on a twin run of the same command."""

from __future__ import annotations

import os

import boto3

from benchmarks import synthetic
from tests.synthetic_sink import write_sink
from tests.test_recovery_guards import _cli  # ``checkpoint-ops ... --json`` through an endpoint, in a process

SINK = ("--sink-compact-interval", "5")
MARKER_KIND = "PUT-IF-NONE-MATCH"  # how the journal's markers (and every new file) are written


def _upload(server: str, bucket: str, prefix: str, tmp_path) -> tuple[str, str]:
    """A synthetic checkpoint and its file sink (12 batches, compact every 5) under ``prefix``, the ledger
    synced (so the operation below finds the pairing recorded and only reads it again after applying)."""
    s3 = boto3.client("s3", endpoint_url=server)
    for rel, data in synthetic.files(batches=12, partitions=1, retain_state=12):
        s3.put_object(Bucket=bucket, Key=f"{prefix}/ckpt/{rel}", Body=data)
    local = str(tmp_path / prefix)
    write_sink(local, 12, compact_interval=5)
    url = f"s3://{bucket}/{prefix}/out"
    for d, _, names in os.walk(local):
        for n in names:
            path = os.path.join(d, n)
            data = open(path, "rb").read().replace(f"file://{local}".encode(), url.encode())
            s3.put_object(Bucket=bucket, Key=f"{prefix}/out/{os.path.relpath(path, local)}", Body=data)
    ckpt = f"s3://{bucket}/{prefix}/ckpt"
    code, r = _cli(server, "ledger", "sync", ckpt, "--sink", url, *SINK)
    assert code == 0, r
    return ckpt, url


def _outage_after_applying(faulty_s3, s3_server, bucket, tmp_path, command) -> tuple[int, dict, str, str]:
    """Run ``command(ckpt, out)`` once through the proxy to count its conditional writes, then on a twin
    with an outage from just after the last of them."""
    ckpt, out = _upload(s3_server, bucket, "twin", tmp_path)
    faulty_s3.clear()
    code, r = _cli(faulty_s3.endpoint, *command(ckpt, out))
    assert code == 0, r
    writes = faulty_s3.reset_stats().requests[MARKER_KIND]
    ckpt, out = _upload(s3_server, bucket, "real", tmp_path)
    faulty_s3.clear()
    faulty_s3.outage(30, after_requests=writes, of_kind=MARKER_KIND)
    code, r = _cli(faulty_s3.endpoint, *command(ckpt, out))
    faulty_s3.calm()
    return code, r, ckpt, out


def _check(code: int, r: dict, operation: str, ckpt: str, out: str, server: str) -> None:
    assert code == 2 and r["error"] == "StoreUnavailableError", r
    assert "nothing was changed" not in r["fix"], r  # before: "nothing was changed; run the same command again"
    assert f"the {operation} " in r["fix"] and " was applied" in r["fix"], r
    assert f"checkpoint-ops ledger sync {ckpt} --sink {out}" in r["fix"], r
    code, h = _cli(server, "history", ckpt)
    assert code == 0 and h["operations"][0]["operation"] == operation, h
    assert h["operations"][0]["status"] == "applied", h
    code, s = _cli(server, "ledger", "sync", ckpt, "--sink", out, *SINK)  # the fix it gives works
    assert code == 0, s


def test_a_store_failure_after_a_sink_retain_applied_says_it_was_applied(faulty_s3, s3_server, bucket, tmp_path):
    code, r, ckpt, out = _outage_after_applying(
        faulty_s3, s3_server, bucket, tmp_path,
        lambda ckpt, out: ["sink", "retain", out, "--checkpoint", ckpt, "--keep-after-batch", "6", *SINK, "--yes"])
    _check(code, r, "sink-retain", ckpt, out, s3_server)


def test_a_store_failure_after_a_rollback_applied_says_it_was_applied(faulty_s3, s3_server, bucket, tmp_path):
    code, r, ckpt, out = _outage_after_applying(
        faulty_s3, s3_server, bucket, tmp_path,
        lambda ckpt, out: ["rollback", ckpt, "--to-batch", "8", "--sink", out, *SINK, "--yes"])
    _check(code, r, "rollback", ckpt, out, s3_server)
