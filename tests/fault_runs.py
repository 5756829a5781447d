"""Operations on a flaky object store: each runs through the fault proxy (tests/faulty_s3.py) on a
checkpoint real Spark wrote, is finished the way its own error message says, and is judged.

A run that stops must stop cleanly: exit 2, ``StoreUnavailableError`` naming the storage failure, a fix
naming the command that finishes it (``checkpoint-ops resume ...``, ``rollback ... --resume``, ``undo``)
or "run the same command again", and nothing half-visible (a checkpoint is fenced or untouched, every
published backup is whole). ``until_done`` then runs exactly what the message says, as a user would,
until the operation completes; a message pointing in a circle would never get there. The result is
judged by ``fsck``, ``backup verify``, byte comparisons and, for rollback and restore, by Spark resuming
with exact output.

Each scenario returns a ``FaultRow`` for docs/reliability.md (``make reliability`` runs the long matrix).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import time
from dataclasses import dataclass, field

import boto3
import s3fs

from pipelines.event_counts import flush_files, read_output
from tests.faulty_s3 import FaultPlan, FaultyS3
from tests.helpers import cli, cli_json
from tests.test_rollback_s3 import objects
from tests.test_rollback_spark import INTERVALS, exact, finish_and_read, target_before_last_compaction

SOURCE_INTERVAL = INTERVALS[:2]
SINK_INTERVAL = INTERVALS[2:]


@dataclass(frozen=True)
class Faults:
    """What the store does during an operation: fail a share of requests (seeded), or go down entirely
    for ``outage_s`` part-way through (each scenario says after how many of its requests)."""

    rate: float = 0.0
    seed: int = 0
    outage_s: float = 0.0

    @property
    def label(self) -> str:
        return f"outage {self.outage_s:g} s" if self.outage_s else f"{round(self.rate * 100)} %"

    @property
    def row_seed(self) -> int | None:
        return None if self.outage_s else self.seed

    def arm(self, proxy: FaultyS3, after: int, of_kind: str) -> None:
        """Before an operation: its faults, and fresh counters. An outage starts once ``after``
        requests of the kind ``of_kind`` went through: part-way through what the operation changes."""
        proxy.clear()
        if self.outage_s:
            proxy.outage(self.outage_s, after_requests=after, of_kind=of_kind)
        else:
            proxy.set_plan(FaultPlan(rate=self.rate, seed=self.seed))


@dataclass
class FaultRow:
    """One operation under one kind of faults: how many runs it took, the retries its ``--json``
    reported, the faults the proxy injected, and whether Spark resumed exactly from the result."""

    operation: str
    faults: str
    seed: int | None
    runs: int = 0
    retries: int = 0
    injected: int = 0
    spark_checked: bool = False
    stops: list[str] = field(default_factory=list)  # the fix each stop printed
    seconds: float = 0.0  # from the first run to the end of the last (outages included)

    def to_dict(self) -> dict:
        return {"kind": "faults", "operation": self.operation, "faults": self.faults, "seed": self.seed,
                "runs": self.runs, "retries": self.retries, "injected": self.injected,
                "spark_checked": self.spark_checked, "stops": self.stops, "seconds": round(self.seconds, 1)}


def record(row: FaultRow) -> None:
    path = os.environ.get("CHECKPOINT_OPS_MATRIX_OUT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row.to_dict()) + "\n")


def via(proxy: FaultyS3) -> tuple[str, str]:
    return ("--storage-options", json.dumps({"endpoint_url": proxy.endpoint}))


def retries_in(doc) -> int:
    """Every retry count under a ``retries`` key of a command's JSON."""
    if isinstance(doc, dict):
        return sum(_ints(v) if k == "retries" else retries_in(v) for k, v in doc.items())
    if isinstance(doc, list):
        return sum(retries_in(v) for v in doc)
    return 0


def _ints(v) -> int:
    if isinstance(v, int):
        return v
    if isinstance(v, dict):
        return sum(_ints(x) for x in v.values())
    return 0


def command_in(fix: str) -> list[str] | None:
    """The ``checkpoint-ops ...`` command a fix names (first one in backquotes), as arguments."""
    if "`checkpoint-ops " not in fix:
        return None
    text = fix.split("`checkpoint-ops ", 1)[1].split("`", 1)[0]
    return shlex.split(text)


def until_done(row: FaultRow, proxy: FaultyS3, first: list, extra: tuple, stopped, max_runs: int = 12,
               after_stop=None) -> dict:
    """Run ``first`` (plus ``--json``) through the proxy; while it stops, check the stop (``stopped``:
    nothing half-visible), wait for an outage to end, and run what its message says, until it
    completes. ``after_stop(n)`` runs after the n-th stop (to break the next run too). Returns the JSON."""
    args = [str(a) for a in first]
    then_again = False  # the last fix said: resume (to drop a journal that may have been stored), then again
    started = time.monotonic()
    while True:
        code, out, err = cli(*args, "--json")
        row.runs += 1
        row.seconds = time.monotonic() - started
        try:
            doc = json.loads(out) if out.strip() else {}
        except ValueError:
            raise AssertionError(f"not JSON (exit {code}): {out[-2000:]}\n{err[-2000:]}") from None
        if code == 0:
            row.retries += retries_in(doc)
            row.injected = proxy.stats.total_faults
            return doc
        if (code == 1 and ("stopped before changing anything" in err or "nothing to resume" in err)) or \
                (then_again and doc.get("error") != "StoreUnavailableError"):
            args = [str(a) for a in first]  # no journal, or it was dropped: plan it again, as it says
            then_again = False
            continue
        assert code == 2 and doc.get("error") == "StoreUnavailableError", (args, code, out[-2000:], err[-3000:])
        assert "Traceback" not in err and "the object store kept failing" in err, err[-3000:]
        row.stops.append(doc["fix"])
        row.retries += retries_in(doc)  # what the stopped run retried before it gave up
        stopped(doc)
        assert row.runs < max_runs, f"not finished after {row.runs} runs; the fixes said: {row.stops}"
        proxy.wait_outage_over()
        if after_stop is not None:
            after_stop(len(row.stops))
        named = command_in(doc["fix"])
        then_again = "then the same command again" in doc["fix"]
        if named is None:
            assert "run the same command again" in doc["fix"], doc["fix"]
            args = [str(a) for a in first]
        else:  # as printed (undo asks to confirm on a terminal: --yes here)
            args = named + list(extra) + (["--yes"] if named[0] == "undo" else [])


# ---- S3 helpers -------------------------------------------------------------------------------------------


def s3_client(endpoint: str):
    return boto3.client("s3", endpoint_url=endpoint)


def upload(local: str, endpoint: str, bucket: str, prefix: str) -> str:
    s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True).put(local + "/", f"{bucket}/{prefix}",
                                                                            recursive=True)
    return f"s3://{bucket}/{prefix}"


def download(endpoint: str, bucket: str, prefix: str, local: str) -> None:
    shutil.rmtree(local, ignore_errors=True)
    s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True).get(f"{bucket}/{prefix}/", local + "/",
                                                                           recursive=True)


def fenced_or(endpoint: str, bucket: str, prefix: str, *unchanged: dict):
    """A stop check: the checkpoint under ``prefix`` is fenced (Spark cannot start) or exactly one of
    ``unchanged`` (nothing of it changed, or all of it did)."""
    def check(_doc):
        now = objects(endpoint, bucket, prefix + "/")
        meta = now.get(f"{prefix}/metadata", b"")
        assert meta.startswith(b"CHECKPOINT-OPS-FENCE") or any(now == u for u in unchanged), \
            "a stopped operation left a half-changed checkpoint Spark could start from"
    return check


def fsck_clean(*args) -> None:
    code, f = cli_json("fsck", *map(str, args))
    assert (code, f.get("findings")) == (0, []), f


# ---- the scenarios -------------------------------------------------------------------------------------------


def rollback_and_undo(spark, run, endpoint: str, bucket: str, proxy: FaultyS3, faults: Faults,
                      spark_check: bool = True) -> list[FaultRow]:
    """Rollback of a checkpoint on S3 (its file sink on local disk) under faults, undo under faults
    (byte for byte), the rollback again under faults (the same bytes as the first), then Spark resumes
    from it with exact output."""
    s3_dir = "ckpt"
    url = upload(run.checkpoint, endpoint, bucket, s3_dir)
    original = objects(endpoint, bucket, s3_dir + "/")
    n = target_before_last_compaction(run)
    extra = (*via(proxy), *SOURCE_INTERVAL)
    rollback = ["rollback", url, "--to-batch", n, "--sink", run.output, *INTERVALS, "--yes", *via(proxy)]
    rows = []

    row = FaultRow("rollback", faults.label, faults.row_seed)
    faults.arm(proxy, 20, "COPY")
    until_done(row, proxy, rollback, extra, fenced_or(endpoint, bucket, s3_dir, original))
    proxy.calm()
    fsck_clean(url, *INTERVALS)
    rolled = objects(endpoint, bucket, s3_dir + "/")
    assert rolled != original
    rows.append(row)

    row = FaultRow("undo", faults.label, faults.row_seed)
    faults.arm(proxy, 20, "COPY")
    until_done(row, proxy, ["undo", url, "--yes", *via(proxy)], extra,
               fenced_or(endpoint, bucket, s3_dir, original, rolled))
    proxy.calm()
    assert objects(endpoint, bucket, s3_dir + "/") == original, "undo did not restore every object"
    rows.append(row)

    if spark_check:
        row = FaultRow("rollback again, after the undo", faults.label, faults.row_seed)
        faults.arm(proxy, 40, "COPY")
        until_done(row, proxy, rollback, extra, fenced_or(endpoint, bucket, s3_dir, original))
        proxy.calm()
        fsck_clean(url, *INTERVALS)
        assert objects(endpoint, bucket, s3_dir + "/") == rolled, "the same rollback left other bytes this time"
        download(endpoint, bucket, s3_dir, run.checkpoint)
        assert finish_and_read(spark, run) == exact(run)
        row.spark_checked = True
        rows.append(row)
    return rows


def rollback_resumed_through_outages(spark, run, endpoint: str, bucket: str, proxy: FaultyS3,
                                     outage_s: float) -> FaultRow:
    """A rollback stopped part-way by an outage, then its resume stopped part-way by another: the next
    resume (what the message says, each time) finishes it, and Spark resumes from it exactly."""
    s3_dir = "ckpt"
    url = upload(run.checkpoint, endpoint, bucket, s3_dir)
    original = objects(endpoint, bucket, s3_dir + "/")
    n = target_before_last_compaction(run)
    rollback = ["rollback", url, "--to-batch", n, "--sink", run.output, *INTERVALS, "--yes", *via(proxy)]
    row = FaultRow("rollback, its resume stopped too", f"outage {outage_s:g} s, twice", None)
    proxy.clear()
    proxy.outage(outage_s, after_requests=20, of_kind="COPY")

    def again(stops: int) -> None:
        if stops == 1:
            proxy.outage(outage_s, after_requests=20, of_kind="COPY")

    until_done(row, proxy, rollback, (*via(proxy), *SOURCE_INTERVAL), fenced_or(endpoint, bucket, s3_dir, original),
               after_stop=again)
    proxy.calm()
    assert len(row.stops) == 2 and all(f"`checkpoint-ops resume {url}`" in fix for fix in row.stops), \
        row.stops
    fsck_clean(url, *INTERVALS)
    download(endpoint, bucket, s3_dir, run.checkpoint)
    assert finish_and_read(spark, run) == exact(run)
    row.spark_checked = True
    return row


def _local_sha(path: str) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _backups_whole(dest: str) -> None:
    """A stop check: every backup published at ``dest`` verifies (none yet is fine too)."""
    code, v = cli_json("backup", "verify", dest)
    if code == 2 and "no backups here" in v.get("problem", ""):
        return  # stopped before the destination was marked: nothing published
    assert code == 0 and v["ok"], v


def backup_create(run, endpoint: str, bucket: str, proxy: FaultyS3, faults: Faults) -> tuple[FaultRow, dict]:
    """A backup of a local checkpoint and sink to S3 under faults: the manifest names exactly the
    bytes on disk, and every backup at the destination verifies."""
    dest = f"s3://{bucket}/backups"
    row = FaultRow("backup create", faults.label, faults.row_seed)
    faults.arm(proxy, 60, "PUT-IF-NONE-MATCH")
    doc = until_done(row, proxy, ["backup", "create", run.checkpoint, dest, "--sink", run.output, *INTERVALS,
                                  *via(proxy)], (), lambda _doc: _backups_whole(dest))
    proxy.calm()
    _backups_whole(dest)
    manifest = json.loads(s3_client(endpoint).get_object(
        Bucket=bucket, Key=f"backups/manifests/{doc['backup_id']}.json")["Body"].read())
    for rid, local in (("checkpoint", run.checkpoint), ("sink0", run.output)):
        for rel, sha, *_ in manifest["roots"][rid]["files"]:
            assert _local_sha(os.path.join(local, rel)) == sha, f"{rid}/{rel} backed up with other bytes"
    return row, doc


def backup_restore(spark, run, bucket: str, proxy: FaultyS3, faults: Faults, backup_id: str, where,
                   spark_check: bool = True) -> FaultRow:
    """Restore from the S3 destination into new local directories (the input relocated) under faults;
    the result passes fsck and Spark resumes from it with exact output."""
    from tests.test_backup_spark import exact as exact_files
    from tests.test_backup_spark import resume_at

    dest = f"s3://{bucket}/backups"
    inp, out, ckpt = str(where / "in"), str(where / "out"), str(where / "ckpt")
    shutil.copytree(run.input, inp)
    row = FaultRow("backup restore", faults.label, faults.row_seed)

    def stopped(_doc):
        meta = os.path.join(ckpt, "metadata")
        assert not os.path.exists(meta) or open(meta, "rb").read().startswith(b"CHECKPOINT-OPS-FENCE"), \
            "a stopped restore left a checkpoint Spark could start from"

    faults.arm(proxy, 250, "GET")
    until_done(row, proxy, ["backup", "restore", dest, backup_id, ckpt, "--sink-target", out,
                            "--relocate", f"{run.input}={inp}", "--yes", *via(proxy)], (*via(proxy), *SOURCE_INTERVAL),
               stopped)
    proxy.calm()
    fsck_clean(ckpt, "--sink", out, *INTERVALS)
    if spark_check:
        flush_files(inp, run.files)
        resume_at(spark, run.flavour, inp, out, ckpt)
        assert read_output(spark, out) == exact_files(run.files)
        row.spark_checked = True
    return row


def backup_prune(run, endpoint: str, bucket: str, proxy: FaultyS3, faults: Faults) -> FaultRow:
    """Three backups (taken without faults), pruned to the newest under faults: the newest stays and
    verifies, the others and their unshared objects are gone."""
    dest = f"s3://{bucket}/backups"
    ids = []
    for _ in range(3):
        code, r = cli_json("backup", "create", run.checkpoint, dest, "--sink", run.output, *INTERVALS)
        assert code == 0, r
        ids.append(r["backup_id"])
    assert cli_json("backup", "verify", dest, ids[-1])[0] == 0
    row = FaultRow("backup prune", faults.label, faults.row_seed)
    faults.arm(proxy, 1, "DELETE-MULTI")
    until_done(row, proxy, ["backup", "prune", dest, "--keep-last", "1", "--yes", *via(proxy)], (),
               lambda _doc: _backups_whole(dest))
    proxy.calm()
    code, listed = cli_json("backup", "list", dest)
    assert [b["id"] for b in listed["backups"]] == ids[-1:], listed
    _backups_whole(dest)
    return row


def sink_compact(run, endpoint: str, bucket: str, proxy: FaultyS3, faults: Faults, backup_id: str) -> FaultRow:
    """A checkpoint and its file sink restored onto S3 (no faults; the sink log's paths relocated
    there), then the sink log compacted under faults: what Spark's readers see is unchanged, fsck
    passes."""
    dest = f"s3://{bucket}/backups"
    ckpt, out = f"s3://{bucket}/restored/ckpt", f"s3://{bucket}/restored/out"
    code, r = cli_json("backup", "restore", dest, backup_id, ckpt, "--sink-target", out, "--yes")
    assert code == 0, r
    code, before = cli_json("inspect", ckpt, "--sink", out, *INTERVALS)
    assert code == 0, before
    original = objects(endpoint, bucket, "restored/ckpt/")
    row = FaultRow("sink compact", faults.label, faults.row_seed)
    faults.arm(proxy, 4, "COPY")
    doc = until_done(row, proxy, ["sink", "compact", out, "--checkpoint", ckpt, *SINK_INTERVAL, "--yes", *via(proxy)],
                     (*via(proxy), *SOURCE_INTERVAL), fenced_or(endpoint, bucket, "restored/ckpt", original))
    proxy.calm()
    counts = (doc.get("plan") or doc["result"])["counts"]  # as applied, or as the resume that finished it says
    assert counts["delete"] > 0, "nothing to compact: the scenario proves nothing"
    code, after = cli_json("inspect", ckpt, "--sink", out, *INTERVALS)
    assert code == 0, after
    assert {k: after["sink"][k] for k in ("files", "bytes")} == {k: before["sink"][k] for k in ("files", "bytes")}
    fsck_clean(ckpt, "--sink", out, *INTERVALS)
    return row
