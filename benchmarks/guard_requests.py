"""Benchmark: what the sink and undo guards cost in requests on the S3 server.

A synthetic checkpoint (``synthetic.py``, stateless: ``--partitions 0``) is uploaded to the local S3 server
(moto over HTTP, a versioned bucket); then ``rollback --yes`` (no ``--sink``, so the recorded-sink check lists
the ledger's pairing records), ``fsck`` and ``undo --yes`` run in process. Every HTTP request of the process
is counted at the client (botocore and aiobotocore, every file manager included), so the checks made before
the lease (``undo``'s pinning of its operation) count too. Run it with the tree to measure first on the path
(``python benchmarks/guard_requests.py`` from that tree) to compare two trees.

Usage: ``python benchmarks/guard_requests.py [--batches N] [--partitions P]``; prints one JSON line per command.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks.rollback import start_s3  # noqa: E402
from benchmarks.synthetic import files  # noqa: E402
from checkpoint_ops.cli import main as cli_main  # noqa: E402

COUNTS: dict[str, int] = {}


def count_requests() -> None:
    """Count every S3 request of this process by operation, synchronous (boto3) and asynchronous (s3fs)."""
    import aiobotocore.client
    import botocore.client

    sync_call, async_call = botocore.client.BaseClient._make_api_call, aiobotocore.client.AioBaseClient._make_api_call

    def counted(self, op, params):
        COUNTS[op] = COUNTS.get(op, 0) + 1
        return sync_call(self, op, params)

    async def counted_async(self, op, params):
        COUNTS[op] = COUNTS.get(op, 0) + 1
        return await async_call(self, op, params)

    botocore.client.BaseClient._make_api_call = counted
    aiobotocore.client.AioBaseClient._make_api_call = counted_async


def run_cli(*args) -> dict:
    COUNTS.clear()
    out, err = io.StringIO(), io.StringIO()
    t = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main([str(a) for a in args])
    seconds = time.perf_counter() - t
    if code != 0:
        raise SystemExit(f"checkpoint-ops {' '.join(map(str, args))} exited {code}: {err.getvalue()[:2000]}")
    return {"requests": sum(COUNTS.values()), "by_operation": dict(sorted(COUNTS.items())), "seconds": round(seconds, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, default=500)
    p.add_argument("--partitions", type=int, default=0, help="HDFS state partitions (0: a stateless query)")
    args = p.parse_args()
    import boto3

    proc, endpoint = start_s3()
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint)
        s3.create_bucket(Bucket="bench-guards")
        s3.put_bucket_versioning(Bucket="bench-guards", VersioningConfiguration={"Status": "Enabled"})
        for rel, body in files(batches=args.batches, partitions=args.partitions, retain_state=50):
            s3.put_object(Bucket="bench-guards", Key=f"queries/ckpt/{rel}", Body=body)
        count_requests()
        url = "s3://bench-guards/queries/ckpt"
        for name, cmd in (("rollback --yes", ["rollback", url, "--to-batch", args.batches - 11, "--yes", "--json"]),
                          ("fsck", ["fsck", url, "--json"]), ("undo --yes", ["undo", url, "--yes", "--json"])):
            print(json.dumps({"command": name, **run_cli(*cmd)}))
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
