"""Benchmark: every command on a long-running checkpoint on the S3 server, requests against the minimum.

A synthetic checkpoint (``synthetic.py``: Spark's real names and formats) after ``--batches`` batches,
with two stateful operators of ``--partitions`` HDFS state partitions each and a file source whose
compact log holds every file it read, as Spark leaves it with ``minBatchesToRetain`` = ``--retain``
(``offsets/``, ``commits/``, source log and state versions). It is uploaded to the S3 server (moto over
HTTP on loopback, in this process, a versioned bucket; every request counted at the server by method),
then, each a child process (peak RSS by ``wait4``, wall time):

``inspect``; ``fsck``; ``rollback --to-batch <latest - 5> --yes``; ``undo --yes``; ``backup create``
(full); ``--advance`` more batches (new files in, retention's deletions out, not counted); ``backup
create`` (incremental); ``backup restore`` to a new prefix.

The minimum each needs, beside it: the paginated LIST of what it must know about (1 request per 1,000
keys), plus the reads and writes it cannot avoid (stated per row).

Usage: ``python benchmarks/s3_load.py [--batches 100000] [--partitions 1000] [--retain 10] [--advance 10]``
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from benchmarks.backup import CountingS3  # noqa: E402
from benchmarks.synthetic import files  # noqa: E402

BUCKET = "load"
CKPT = f"s3://{BUCKET}/queries/events"
BACKUPS = f"s3://{BUCKET}/backups/events"
RESTORED = f"s3://{BUCKET}/restored/events"


def cli(env: dict, *args: str) -> tuple[dict, float, float, int]:
    """(JSON output, wall s, the child's own peak RSS MiB, exit code) of one command in a child process."""
    import tempfile

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-m", "checkpoint_ops.cli", *args], stdout=out, stderr=err, env=env,
                             cwd=ROOT)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = code = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t
        out.seek(0)
        err.seek(0)
        text, problem = out.read(), err.read()
    try:
        doc = json.loads(text or b"{}")
    except ValueError:
        doc = {"stdout": text.decode(errors="replace")[-500:]}
    if code != 0:
        print(f"{' '.join(args)} exited {code}: {problem.decode(errors='replace')[-2000:]}", file=sys.stderr)
    return doc, wall, ru.ru_maxrss / 1024, code


def put_all(s3, items, threads: int = 16) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(lambda kv: s3.put_object(Bucket=BUCKET, Key=f"queries/events/{kv[0]}", Body=kv[1]), items))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=100_000)
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--retain", type=int, default=10)
    ap.add_argument("--advance", type=int, default=10)
    args = ap.parse_args(argv)
    import boto3

    server = CountingS3()
    env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
    env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
               AWS_ENDPOINT_URL=server.endpoint)
    os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")})
    s3 = boto3.client("s3", endpoint_url=server.endpoint)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    shape = dict(partitions=args.partitions, retain_state=args.retain, retain_log=args.retain,
                 retain_offsets=args.retain, operators=2)
    t = time.perf_counter()
    before = dict(files(batches=args.batches, **shape))
    before.pop("state/0/0/_metadata/schema", None)  # placeholders, not real schema files
    before.pop("state/1/0/_metadata/schema", None)
    put_all(s3, list(before.items()))
    objects = len(before)
    print(f"uploaded {objects:,} objects in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    server.take()
    pages = math.ceil(objects / 1000)
    latest = args.batches - 1
    retained_logs = sum(1 for k in before if k.startswith(("offsets/", "commits/", "sources/")))
    offsets_files = sum(1 for k in before if k.startswith("offsets/"))
    rows = []

    def step(name: str, minimum: int, why: str, *cmd: str) -> dict:
        doc, wall, rss, code = cli(env, *cmd)
        got = server.take()
        rows.append((name, sum(got.values()), got, minimum, why, wall, rss, code, os.getloadavg()[0]))
        print(f"{name}: {sum(got.values())} requests {got}, {wall:.1f} s, exit {code}", file=sys.stderr, flush=True)
        return doc

    step("inspect", pages + 1 + offsets_files, "LIST + metadata + every retained offsets file (the batches it lists)",
         "inspect", CKPT, "--json")
    step("fsck", pages + 1 + retained_logs, "LIST + metadata + every retained log file (each is judged)",
         "fsck", CKPT, "--json")
    plan = cli(env, "rollback", CKPT, "--to-batch", str(latest - 5), "--dry-run", "--json")[0]
    server.take()
    deletes = sum(1 for a in plan.get("plan", {}).get("actions", []) if a.get("kind") == "delete")
    step("rollback", pages + math.ceil(deletes / 1000),
         f"LIST + batched DeleteObjects of the {deletes:,} files it deletes", "rollback", CKPT, "--to-batch",
         str(latest - 5), "--yes", "--json")
    step("undo", math.ceil(deletes / 1000) + math.ceil(deletes / 1000),
         "LIST of the delete markers + batched removal of them", "undo", CKPT, "--yes", "--json")
    step("backup create (full)", pages + objects, "LIST + one copy per object", "backup", "create", CKPT, BACKUPS,
         "--json")
    after = dict(files(batches=args.batches + args.advance, **shape))
    after.pop("state/0/0/_metadata/schema", None)
    after.pop("state/1/0/_metadata/schema", None)
    new = [(k, v) for k, v in after.items() if k not in before]
    gone = [k for k in before if k not in after]
    put_all(s3, new)
    for i in range(0, len(gone), 1000):
        s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": f"queries/events/{k}"} for k in gone[i:i + 1000]],
                                                 "Quiet": True})
    server.take()
    step("backup create (incremental)", math.ceil(len(after) / 1000) + len(new),
         f"LIST + one copy per new object ({len(new):,})", "backup", "create", CKPT, BACKUPS, "--json")
    listed = cli(env, "backup", "list", BACKUPS, "--json")[0]
    server.take()
    backup_id = listed["backups"][-1]["id"] if listed.get("backups") else "latest"
    step("backup restore", math.ceil(len(after) / 1000) + len(after),
         "LIST of the backup + one copy per object restored", "backup", "restore", BACKUPS, backup_id, RESTORED, "--yes",
         "--json")
    server.server.shutdown()

    print(f"`python benchmarks/s3_load.py --batches {args.batches} --partitions {args.partitions} --retain "
          f"{args.retain} --advance {args.advance}` ({platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}): {objects:,} objects (two operators × {args.partitions:,} partitions "
          f"× {args.retain} versions, logs of the last {args.retain} batches, a source log compacted over all "
          f"{args.batches:,} batches); requests counted at the server by method.\n")
    print("| command | requests | by method | minimum | of which | ratio | wall s | peak RSS "
          "| exit | load average |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, total, got, minimum, why, wall, rss, code, load in rows:
        by = ", ".join(f"{k} {v:,}" for k, v in sorted(got.items(), key=lambda kv: -kv[1]))
        print(f"| `{name}` | {total:,} | {by} | {minimum:,} | {why} | **{total / max(minimum, 1):.2f}x** "
              f"| {wall:.1f} | {rss:.0f} MiB | {code} | {load:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
