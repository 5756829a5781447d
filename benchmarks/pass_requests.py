"""Benchmark: the requests a materialization's checks make on the S3 server, as the checkpoint grows.

The synthetic checkpoint and sink of ``check_pass.py`` (Spark's names and formats, one HDFS operator, a
file source, the sink log compacted every 10), retaining ``N`` batches, uploaded to the S3 server (moto in
server mode on loopback, as the tests start it). After each round of ``--new`` batches (uploaded after a
pause longer than ``verdicts.MTIME_SLACK``, as a query that runs now and then leaves them), side by side
on the same objects:

* (before) what a materialization did before the verdict cache: ``ledger sync``, ``inspect`` and the
  health check's ``fsck``, each on its own model, each reading every retained file;
* (now) ``check_pass.run_check_pass(batches=False)``, the asset's one pass (the verdict cache, the window
  memo), reading what is new.

Requests are the file managers' own counts (``OpCounter``: every attempt, by kind). The cold pass (the
first, no cache yet: it reads everything once) is shown apart; a round of new batches and a pass follow it
unmeasured, since the upload wrote every object within seconds (to the cold pass all of them are files
Spark may still rewrite, ``verdicts.MTIME_SLACK``, and none is cached).

Usage: ``python benchmarks/pass_requests.py [--sizes 1000,2000] [--new 10] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks.check_pass import Stream  # noqa: E402
from checkpoint_ops.check_pass import run_check_pass  # noqa: E402
from checkpoint_ops.fsck import run_fsck  # noqa: E402
from checkpoint_ops.inspect import inspect_checkpoint  # noqa: E402
from checkpoint_ops.ledger import Ledger  # noqa: E402
from checkpoint_ops.ledger import sync as sync_ledger  # noqa: E402
from checkpoint_ops.model.checkpoint import Checkpoint, open_sink  # noqa: E402
from checkpoint_ops.verdicts import MTIME_SLACK  # noqa: E402


class Server:
    """The S3 server the tests use (``tests/s3_server.py``), on a free loopback port."""

    def __enter__(self) -> "Server":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
        self.proc = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(HERE), "tests", "s3_server.py"),
                                      str(port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the S3 server did not start")
        self.endpoint = f"http://127.0.0.1:{port}"
        os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                          AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=self.endpoint)
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class Mirror:
    """Uploads what changed in the local checkpoint and sink since the last upload (16 at a time)."""

    def __init__(self, s3, bucket: str, stream: Stream):
        self.s3, self.bucket, self.stream = s3, bucket, stream
        self.sent: dict[str, int] = {}

    def upload(self) -> int:
        items = []
        for base, prefix in ((self.stream.ckpt, "ckpt"), (self.stream.out, "out")):
            for d, _, names in os.walk(base):
                for name in names:
                    path = os.path.join(d, name)
                    key = f"{prefix}/{os.path.relpath(path, base)}"
                    mtime = os.stat(path).st_mtime_ns
                    if self.sent.get(key) != mtime:
                        items.append((key, path))
                        self.sent[key] = mtime
        def put(item) -> None:
            key, path = item
            with open(path, "rb") as f:
                self.s3.put_object(Bucket=self.bucket, Key=key, Body=f.read())

        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            list(ex.map(put, items))
        return len(items)


def _requests(*managers) -> int:
    return sum(m.counter.total for m in managers)


def _model(bucket: str):
    ckpt = Checkpoint.open(f"s3://{bucket}/ckpt")
    return ckpt, [open_sink(f"s3://{bucket}/out")]


def before(bucket: str) -> tuple[int, float]:
    t, total = time.perf_counter(), 0
    for step in ("sync", "inspect", "fsck"):
        ckpt, sinks = _model(bucket)
        if step == "sync":
            sync_ledger(ckpt, sinks)
        elif step == "inspect":
            inspect_checkpoint(ckpt, sinks, ledger=Ledger.for_checkpoint(ckpt))
        else:
            run_fsck(ckpt, sinks, ledger=Ledger.for_checkpoint(ckpt))
        total += _requests(ckpt.fm, sinks[0].listing.fm)
    return total, time.perf_counter() - t


def now(bucket: str) -> tuple[int, float, int, int]:
    t = time.perf_counter()
    ckpt, sinks = _model(bucket)
    p = run_check_pass(ckpt, sinks, batches=False)
    return _requests(ckpt.fm, sinks[0].listing.fm), time.perf_counter() - t, p.cache_hits, p.window_hits


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,2000", help="retained batches of each checkpoint")
    ap.add_argument("--new", type=int, default=10, help="new batches per round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    import boto3

    work = tempfile.mkdtemp(prefix="pass-requests-")
    rows = []
    try:
        with Server() as server:
            s3 = boto3.client("s3", endpoint_url=server.endpoint)
            for size in (int(x) for x in args.sizes.split(",")):
                bucket = f"pass-requests-{size}"
                s3.create_bucket(Bucket=bucket)
                stream = Stream(os.path.join(work, str(size)), size)
                for _ in range(size):
                    stream.batch()
                mirror = Mirror(s3, bucket, stream)
                t = time.perf_counter()
                sent = mirror.upload()
                print(f"[{size}] uploaded {sent:,} objects in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
                time.sleep(MTIME_SLACK + 1)
                cold = now(bucket)  # the first pass: no cache yet (it reads everything once)
                # the upload wrote every object within seconds, so to the first pass all were files Spark may
                # still rewrite (verdicts.MTIME_SLACK): the pass after the next batches is the first to cache them
                time.sleep(MTIME_SLACK + 1)
                for _ in range(args.new):
                    stream.batch()
                mirror.upload()
                now(bucket)
                old, new = [], []
                for r in range(args.rounds):
                    time.sleep(MTIME_SLACK + 1)
                    for _ in range(args.new):
                        stream.batch()
                    mirror.upload()
                    old.append(before(bucket))
                    new.append(now(bucket))
                    print(f"[{size}] round {r + 1}: before {old[-1][0]:,} requests {old[-1][1]:.1f} s, now "
                          f"{new[-1][0]:,} requests {new[-1][1]:.1f} s", file=sys.stderr, flush=True)
                rows.append((size, cold, old, new, os.getloadavg()[0]))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"`python benchmarks/pass_requests.py --sizes {args.sizes} --new {args.new} --rounds {args.rounds}` "
          f"({platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, the S3 server on "
          f"loopback); medians of {args.rounds} rounds of {args.new} new batches:\n")
    print("| retained batches | before: sync + inspect + fsck, requests | wall s | now: the asset's pass, requests "
          "| wall s | now / before (requests) | cold pass (first, no cache): requests, wall s | cache hits, window "
          "memo hits | load average |")
    print("|---|---|---|---|---|---|---|---|---|")
    for size, cold, old, new, load in rows:
        b_req, b_wall = statistics.median(x[0] for x in old), statistics.median(x[1] for x in old)
        n_req, n_wall = statistics.median(x[0] for x in new), statistics.median(x[1] for x in new)
        print(f"| {size:,} | {b_req:,.0f} | {b_wall:.1f} | {n_req:,.0f} | {n_wall:.2f} | **{n_req / b_req:.3f}x** "
              f"| {cold[0]:,}, {cold[1]:.1f} | {new[-1][2]:,}, {new[-1][3]:,} | {load:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
